package main

import (
	"testing"

	"github.com/spf13/cobra"
)

// TestEveryCommandHasExamples: the README promises that every command's
// --help has examples; every command, a group of subcommands too, has some.
func TestEveryCommandHasExamples(t *testing.T) {
	groupExamples(rootCmd) // as main does
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "completion" || c.Name() == "help" { // cobra's own
			return
		}
		if (c.Runnable() || c.HasSubCommands()) && c != rootCmd && !c.Hidden && c.Example == "" {
			t.Errorf("%s has no examples in its --help", c.CommandPath())
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(rootCmd)
}
