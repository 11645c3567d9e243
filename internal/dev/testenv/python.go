package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PythonVenv is a Python virtualenv, made by .ci/run, whose real client an
// interop test or benchmark drives.
type PythonVenv struct {
	Env     string // the variable naming its python, e.g. TRACE_OPENENV_PYTHON
	Dir     string // its directory when Env is unset
	Package string // the distribution the test is written against
	Version string // and its version
	Install string // pip's arguments that make it
}

// The venvs of the interop tests (.ci/run makes each).
var (
	OpenEnvVenv   = PythonVenv{Env: "TRACE_OPENENV_PYTHON", Dir: "/var/cache/trace/openenv-venv", Package: "openenv-core", Version: "0.3.0", Install: "openenv-core==0.3.0 uvloop==0.23.0 httptools==0.9.0"}
	VerifiersVenv = PythonVenv{Env: "TRACE_VERIFIERS_PYTHON", Dir: "/var/cache/trace/verifiers-venv", Package: "verifiers", Version: "0.4.0", Install: "verifiers==0.4.0 openenv-core==0.3.0"}
	OpenAIVenv    = PythonVenv{Env: "TRACE_OPENAI_PYTHON", Dir: "/var/cache/trace/openai-venv", Package: "openai", Version: "3.63.0", Install: "openai==3.63.0"}
)

// Path is the venv's python: $Env, else Dir/bin/python.
func (v PythonVenv) Path() string {
	if py := os.Getenv(v.Env); py != "" {
		return py
	}
	return filepath.Join(v.Dir, "bin", "python")
}

// Require returns the venv's python. A python that is missing, or that
// does not have Package, ends the test as unavailable (Unavailable: a skip,
// or a failure with TRACE_REQUIRE_SERVERS=1) saying how to make it; a
// version other than Version is logged.
func (v PythonVenv) Require(t testing.TB) string {
	t.Helper()
	py := v.Path()
	if _, err := os.Stat(py); err != nil {
		Unavailable(t, "no %s python at %s (%s): python3 -m venv %s && %s/bin/pip install %s", v.Package, py, v.Env, v.Dir, v.Dir, v.Install)
	}
	out, err := exec.Command(py, "-c", "import importlib.metadata as m; print(m.version('"+v.Package+"'))").CombinedOutput()
	if err != nil {
		Unavailable(t, "%s does not have %s: %v\n%s", py, v.Package, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != v.Version {
		t.Logf("%s %s (the test is written against %s)", v.Package, got, v.Version)
	}
	return py
}

// RunPythonJSON runs script with py, giving it in as JSON in a file (its
// one argument), and decodes the last line of its standard output into
// out; env, when not nil, is the script's whole environment. The test
// fails, with both outputs, when the script fails or its last line does
// not decode.
func RunPythonJSON(ctx context.Context, t testing.TB, py, script string, in, out any, env []string) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	inFile := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(inFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, py, script, inFile)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", script, err, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), out); err != nil {
		t.Fatalf("%s: output %q: %v\nstderr:\n%s", script, stdout.String(), err, stderr.String())
	}
}
