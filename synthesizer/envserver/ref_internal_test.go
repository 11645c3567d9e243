package envserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/openenv"
)

// A tool's parameters schema comes from a program (and the target's tool
// schemas from rollouts): a $ref to a file must not make the server read
// it (jsonschema's default loader reads file:// URLs). The environment is
// refused instead.
func TestToolSchemaRefsLoadNoFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(file, []byte(`{"required": ["read_from_disk"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	src := fmt.Sprintf(`"""A test program."""
def tools():
    return [{"type": "function", "function": {"name": "t", "parameters": {"type": "object", "$ref": %q}}}]
def reset(seed):
    return {"system": "s", "user": "u", "state": {}}
def step(state, call):
    return {"result": "ok", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
`, "file://"+file)
	env, err := envprog.Load(context.Background(), "ref.star", []byte(src), envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cat := NewStaticCatalog()
	if err := cat.Add("ref", env, Entry{}); err != nil {
		t.Fatal(err)
	}
	srv, err := New(DefaultConfig(), Options{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	e, err := srv.environment(context.Background(), "ref")
	if err == nil {
		verr := e.validate(openenv.Action{ToolCalls: []openenv.Call{{Name: "t", Arguments: []byte(`{}`)}}})
		t.Fatalf("the environment was served; arguments {} are answered %v", verr)
	}
	if !strings.Contains(err.Error(), "$ref") {
		t.Errorf("the refusal does not name the $ref: %v", err)
	}
}
