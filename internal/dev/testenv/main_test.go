package testenv_test

import (
	"testing"

	"github.com/traceops/trace/internal/dev/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
