package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/traceops/trace/internal/config"
)

// TestEveryCommandHasHelp: the README promises that every command has
// --help with examples. Every command of trace (cobra's own help and
// completion aside) has a short description, every runnable one an
// example, and every flag a line of help.
func TestEveryCommandHasHelp(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			path := sub.CommandPath()
			if sub.Short == "" {
				t.Errorf("%s: no short description", path)
			}
			if sub.Runnable() && strings.TrimSpace(sub.Example) == "" {
				t.Errorf("%s: no example in --help", path)
			}
			sub.LocalFlags().VisitAll(func(f *pflag.Flag) {
				if f.Name != "help" && strings.TrimSpace(f.Usage) == "" {
					t.Errorf("%s --%s: no help text", path, f.Name)
				}
			})
			walk(sub)
		}
	}
	walk(rootCmd)
}

// TestRunHelpNamesEveryRole: trace run --help describes each role --roles
// takes, and the summaries name the default ones.
func TestRunHelpNamesEveryRole(t *testing.T) {
	run, _, err := rootCmd.Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range config.Roles {
		if !strings.Contains(run.Long, "\n  "+role+" ") {
			t.Errorf("trace run --help does not describe the role %q:\n%s", role, run.Long)
		}
	}
	for _, role := range config.DefaultRoles {
		if !strings.Contains(run.Short, role) {
			t.Errorf("trace run's summary %q does not name the default role %q", run.Short, role)
		}
		if !strings.Contains(rootCmd.Long, role) {
			t.Errorf("trace --help's line for trace run does not name the default role %q", role)
		}
	}
}
