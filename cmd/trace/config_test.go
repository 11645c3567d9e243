package main

import (
	"context"
	"strings"
	"testing"
)

func TestConfigPrintRedactsSecrets(t *testing.T) {
	t.Setenv("TRACE_CLICKHOUSE__PASSWORD", "hunter2")
	out, err := runCLI(t, context.Background(), "config", "print", "--set", "llm.api_key=sk-secret", "--set", "kafka.sasl.mechanism=plain",
		"--set", "kafka.sasl.username=u", "--set", "kafka.sasl.password=p4ss", "--set", "http.bearer_token=tok3n")
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"hunter2", "sk-secret", "p4ss", "tok3n"} {
		if strings.Contains(out, secret) {
			t.Errorf("config print shows a secret %q:\n%s", secret, out)
		}
	}
	for _, want := range []string{"[REDACTED]", "rollouts_topic: trace.rollouts", "labeler: rules", "min_failures: 20"} {
		if !strings.Contains(out, want) {
			t.Errorf("config print lacks %q:\n%s", want, out)
		}
	}
	_, err = runCLI(t, context.Background(), "config", "print", "--set", "analyzer.labeler=magic")
	if err == nil || !strings.Contains(err.Error(), "analyzer.labeler") {
		t.Fatalf("bad config: %v", err)
	}
}
