package prompts

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEmbeddedAndOverride(t *testing.T) {
	if names := Names(); !slices.Contains(names, Label) || !slices.Contains(names, Discover) {
		t.Fatalf("embedded prompts %v", names)
	}
	text, origin, err := Default().Text(Label)
	if err != nil || origin != "embedded:label.md" || !strings.Contains(text, "<rollout_data>") {
		t.Fatalf("%s %v", origin, err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, Label), []byte("override {{.X}}"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if text, origin, _ := s.Text(Label); text != "override {{.X}}" || origin != filepath.Join(dir, Label) {
		t.Fatalf("%q from %s", text, origin)
	}
	if _, origin, _ := s.Text(Discover); origin != "embedded:discover.md" {
		t.Fatalf("discover from %s", origin)
	}
	tmpl, err := s.Template(Label)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, map[string]any{}); err == nil {
		t.Fatal("missing key rendered")
	}
	for _, bad := range []string{"../label.md", "a/label.md", "", "nope.md"} {
		if _, _, err := s.Text(bad); err == nil {
			t.Errorf("Text(%q) succeeded", bad)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, Discover), []byte("{{.Broken"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Template(Discover); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("parse error %v should name the override file", err)
	}
	if _, err := New(filepath.Join(dir, Label)); err == nil {
		t.Fatal("a file accepted as override directory")
	}
}

func TestEmbeddedTemplatesParse(t *testing.T) {
	for _, n := range Names() {
		if _, err := Default().Template(n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}
