package envprog_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
)

// TestDocExample keeps the complete example of docs/environments.md true:
// it passes every check against the simulated airline tools.
func TestDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/environments.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "### A complete example")
	if !ok {
		t.Fatal("docs/environments.md has no complete example")
	}
	_, rest, _ = strings.Cut(rest, "```python\n")
	src, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the example's code block is not closed")
	}
	r, env, err := envprog.ValidateSource(context.Background(), "lookup.star", []byte(src), airlineTools(t), envprog.Limits{}, envprog.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if env != nil {
		env.Close()
	}
	for _, c := range r.Checks {
		if c.Verdict != envprog.Pass {
			t.Errorf("%s %s: %s", c.Verdict, c.Name, c.Msg)
		}
	}
}
