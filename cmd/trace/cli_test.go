package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// runCLI runs the trace command line in-process and returns what it printed.
// Flags are reset to their defaults first: cobra keeps them between runs.
func runCLI(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	resetFlags(rootCmd)
	setContext(rootCmd, ctx)
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&out)
	rootCmd.SetArgs(args)
	err := rootCmd.ExecuteContext(ctx)
	return out.String(), err
}

func resetFlags(c *cobra.Command) {
	reset := func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			sv.Replace(nil)
		} else {
			f.Value.Set(f.DefValue)
		}
		f.Changed = false
	}
	c.Flags().VisitAll(reset)
	c.PersistentFlags().VisitAll(reset)
	for _, sub := range c.Commands() {
		resetFlags(sub)
	}
}

// setContext gives every command ctx: cobra hands a parent's context to a
// subcommand only when the subcommand has none, so a context from an
// earlier (cancelled) run would otherwise stay.
func setContext(c *cobra.Command, ctx context.Context) {
	c.SetContext(ctx)
	for _, sub := range c.Commands() {
		setContext(sub, ctx)
	}
}
