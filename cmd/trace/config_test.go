package main

import (
	"context"
	"os"
	"path/filepath"
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
	// A role's own settings are checked for the roles given, as trace run
	// --roles checks them.
	if _, err := runCLI(t, context.Background(), "config", "print", "--set", "router.cache_max=-5"); err != nil {
		t.Fatalf("router.* without the route role: %v", err)
	}
	_, err = runCLI(t, context.Background(), "config", "print", "--roles", "route", "--set", "router.cache_max=-5")
	if err == nil || !strings.Contains(err.Error(), "router.cache_max") {
		t.Fatalf("config print --roles route with a bad router.cache_max: %v", err)
	}
}

// TestConfigPrintShowsEffectiveValues: config print shows the settings in
// effect, the defaults that apply to an unset or 0 one (query_timeout 10s,
// not 0s) and -1 for no limit, and what it prints loads back the same.
func TestConfigPrintShowsEffectiveValues(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		want []string
	}{
		{"defaults", nil, []string{"query_timeout: 10s", "query_max_memory: 1073741824"}},
		{"zero takes the default", []string{"clickhouse.query_timeout=0", "clickhouse.query_max_memory=0"}, []string{"query_timeout: 10s", "query_max_memory: 1073741824"}},
		{"no limit", []string{"clickhouse.query_timeout=-1s", "clickhouse.query_max_memory=-1"}, []string{"query_timeout: -1\n", "query_max_memory: -1\n"}},
		{"set", []string{"clickhouse.query_timeout=1m30s", "clickhouse.query_max_memory=2048"}, []string{"query_timeout: 1m30s", "query_max_memory: 2048"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"config", "print"}
			for _, s := range tt.set {
				args = append(args, "--set", s)
			}
			out, err := runCLI(t, context.Background(), args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("config print lacks %q:\n%s", w, out)
				}
			}
			f := filepath.Join(t.TempDir(), "printed.yaml")
			if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			again, err := runCLI(t, context.Background(), "config", "print", "--config", f)
			if err != nil {
				t.Fatalf("config print of what it printed: %v", err)
			}
			if again != out {
				t.Errorf("config print of what it printed:\n%s\nwant:\n%s", again, out)
			}
		})
	}
}
