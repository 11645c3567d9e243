package envprog_test

import (
	"os"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
)

// probes are what the test binary runs instead of its tests when
// probeEnv names one (a test that re-executes the binary).
var probes = map[string]func() int{}

const probeEnv = "TRACE_ENVPROG_TEST_PROBE"

// TestMain lets the test binary serve as the sandbox worker of
// LoadSandboxed (it re-executes the current binary), or run a probe.
func TestMain(m *testing.M) {
	envprog.RunWorkerIfRequested()
	if p := probes[os.Getenv(probeEnv)]; p != nil {
		os.Exit(p())
	}
	os.Exit(m.Run())
}
