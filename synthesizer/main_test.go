package synthesizer

import (
	"testing"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/synthesizer/envprog"
)

// TestMain lets the test binary serve as envprog's sandbox worker (programs
// written by a model are validated and calibrated sandboxed).
func TestMain(m *testing.M) {
	envprog.RunWorkerIfRequested()
	testenv.Main(m)
}
