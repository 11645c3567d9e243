package main

import (
	"bytes"
	"context"
	"testing"
)

// runCLI runs the trace command line in-process and returns what it printed.
func runCLI(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&out)
	rootCmd.SetArgs(args)
	err := rootCmd.ExecuteContext(ctx)
	return out.String(), err
}
