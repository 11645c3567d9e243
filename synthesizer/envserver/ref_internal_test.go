package envserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/openenv"
)

// toolsEnv is an Env that is not a loaded program (a Go one, which no
// load checked): only its tools matter here.
type toolsEnv struct{ tools []schemas.Tool }

func (e toolsEnv) Info() envprog.Info { return envprog.Info{Name: "tools", Tools: e.tools} }
func (toolsEnv) Reset(context.Context, int64) (envprog.Episode, error) {
	return nil, errors.New("not played")
}
func (toolsEnv) Close() error { return nil }

// A tool's parameters schema comes from a program (and the target's tool
// schemas from rollouts): a $ref to a file must not make the server read
// it (jsonschema's default loader reads file:// URLs). A program with one
// does not load (envprog.CompileParameters, which validation meets); an
// Env that was not loaded is refused by the server, through the same
// check, naming the tool and the ref.
func TestToolSchemaRefsLoadNoFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(file, []byte(`{"required": ["read_from_disk"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	params := fmt.Sprintf(`{"type": "object", "$ref": %q}`, "file://"+file)
	src := fmt.Sprintf(`"""A test program."""
def tools():
    return [{"type": "function", "function": {"name": "t", "parameters": %s}}]
def reset(seed):
    return {"system": "s", "user": "u", "state": {}}
def step(state, call):
    return {"result": "ok", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
`, params)
	if _, err := envprog.Load(context.Background(), "ref.star", []byte(src), envprog.Limits{}); err == nil || !strings.Contains(err.Error(), "tool t") || !strings.Contains(err.Error(), file) {
		t.Fatalf("a program with a $ref to a file loaded: %v, want an error naming tool t and the ref", err)
	}

	cat := NewStaticCatalog()
	env := toolsEnv{tools: []schemas.Tool{{Type: "function", Function: schemas.FunctionDef{Name: "t", Parameters: json.RawMessage(params)}}}}
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
	if !strings.Contains(err.Error(), "$ref") || !strings.Contains(err.Error(), "tool t") || !strings.Contains(err.Error(), file) {
		t.Errorf("the refusal does not name the tool and the $ref: %v", err)
	}
}
