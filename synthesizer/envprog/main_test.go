package envprog_test

import (
	"os"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
)

// TestMain lets the test binary serve as the sandbox worker of
// LoadSandboxed (it re-executes the current binary).
func TestMain(m *testing.M) {
	envprog.RunWorkerIfRequested()
	os.Exit(m.Run())
}
