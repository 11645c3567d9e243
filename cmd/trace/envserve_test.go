package main

import "testing"

func TestEnvID(t *testing.T) {
	for in, want := range map[string]string{
		"synthesizer/examples/precondition_airline.star": "precondition_airline",
		"/tmp/my env (2).star":                           "my_env__2_",
		"a.b.star":                                       "a.b",
		".star":                                          "env",
	} {
		if got := envID(in); got != want {
			t.Errorf("envID(%q) = %q, want %q", in, got, want)
		}
	}
	if c, _, err := rootCmd.Find([]string{"env", "serve"}); err != nil || c.Name() != "serve" {
		t.Fatalf("trace env serve is not registered: %v", err)
	}
}
