package analyzer

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestDictionaryChoiceLoggedOnce: the labeling stage logs which dictionary
// labels a cohort once, and again only when the choice changes.
func TestDictionaryChoiceLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	s := &LabelingSink{Log: slog.New(slog.NewTextHandler(&buf, nil))}
	def := testDict(AnyEnvironment, AnyVersion, 1, "default_cap")
	own := testDict("tau2-airline", AnyVersion, 2, "env_cap")
	for range 3 {
		s.logChoice("tau2-airline", "gpt-4o", def)
		s.logChoice("tau2-retail", "gpt-4o", def)
	}
	s.logChoice("tau2-airline", "gpt-4o", own)
	s.logChoice("tau2-airline", "gpt-4o", own)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "dictionary=*/*") || !strings.Contains(lines[0], "the default dictionary") ||
		!strings.Contains(lines[2], "dictionary=tau2-airline/*") || !strings.Contains(lines[2], "dictionary_version=2") {
		t.Errorf("log:\n%s", buf.String())
	}
}
