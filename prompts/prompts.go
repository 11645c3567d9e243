// Package prompts holds the markdown prompts of trace's LLM agents, embedded
// in the binary and overridable file by file from a directory.
//
// Each prompt is a text/template. A Set resolves a name (e.g. "label.md") in
// its override directory first and falls back to the embedded copy, so an
// operator can tune one prompt without rebuilding and without copying the
// others. Templates are parsed with missingkey=error: an override that uses a
// field the caller does not provide fails at render time instead of sending
// "<no value>" to a model.
package prompts

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"text/template"
)

//go:embed *.md
var embedded embed.FS

// Names of the prompts.
const (
	Label               = "label.md"                // capability labeling (analyzer.LLMLabeler)
	Discover            = "discover.md"             // capability discovery (analyzer.Discoverer)
	GenerateEnvironment = "generate_environment.md" // environment generation (synthesizer.Generator)
	PlanTraining        = "plan_training.md"        // training plan adjustment (adapter.LLMPlanner)
	Route               = "route.md"                // routing classifier (router.Router): templates "system" and "user"
)

// Set resolves prompts: a file in Dir wins over the embedded one.
type Set struct {
	// Dir is the override directory; "" means embedded prompts only.
	Dir string
}

// Default is the embedded prompts without overrides.
func Default() *Set { return &Set{} }

// New returns a set that reads overrides from dir ("" for none). A dir that
// is given must exist and be a directory.
func New(dir string) (*Set, error) {
	if dir == "" {
		return Default(), nil
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("prompts: override directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("prompts: override directory %s is not a directory", dir)
	}
	return &Set{Dir: dir}, nil
}

// Text returns the prompt's source and where it came from (the override
// file's path, or "embedded:<name>").
func (s *Set) Text(name string) (text, origin string, err error) {
	if !fs.ValidPath(name) || filepath.Base(name) != name {
		return "", "", fmt.Errorf("prompts: invalid prompt name %q", name)
	}
	if s != nil && s.Dir != "" {
		p := filepath.Join(s.Dir, name)
		b, err := os.ReadFile(p)
		if err == nil {
			return string(b), p, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", "", fmt.Errorf("prompts: %w", err)
		}
	}
	b, err := embedded.ReadFile(name)
	if err != nil {
		return "", "", fmt.Errorf("prompts: no prompt %q", name)
	}
	return string(b), "embedded:" + name, nil
}

// Template parses the prompt as a text/template named name.
func (s *Set) Template(name string) (*template.Template, error) {
	text, origin, err := s.Text(name)
	if err != nil {
		return nil, err
	}
	t, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("prompts: %s: %w", origin, err)
	}
	return t, nil
}

// Names lists the embedded prompts.
func Names() []string {
	ents, _ := fs.ReadDir(embedded, ".")
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
