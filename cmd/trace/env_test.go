package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

func TestEnvValidateExample(t *testing.T) {
	// The target's tools as a synthesis request carries them: the simulated
	// airline environment's.
	tools, _ := json.Marshal(map[string]any{"tools": simulate.Tools(simulate.Airline)})
	toolsFile := filepath.Join(t.TempDir(), "request.json")
	if err := os.WriteFile(toolsFile, tools, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, context.Background(), "env", "validate", "example:precondition_airline", "--tools", toolsFile, "--seeds", "30")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, check := range []string{"load", "contract", "docstring", "tools_match_target", "tool_count", "reset_deterministic", "distinct_instances",
		"step_deterministic", "random_play_runs", "reward_range", "do_nothing_scores_low", "reference_scores_one", "hint_is_guidance"} {
		if !strings.Contains(out, "PASS "+check+": ") {
			t.Errorf("no PASS %s in\n%s", check, out)
		}
	}
	if !strings.Contains(out, "13 passed, 0 failed, 0 skipped") {
		t.Errorf("summary missing:\n%s", out)
	}
}

func TestEnvValidateFailsWithExitOne(t *testing.T) {
	// The example with a reward that pays 0.4 for anything: doing nothing
	// scores 0.4 on every seed.
	src := strings.Replace(string(examples.PreconditionAirline), `"reward": 0.6 * action + 0.4 * communication`, `"reward": 0.4 + 0.6 * action`, 1)
	file := filepath.Join(t.TempDir(), "lenient.star")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, context.Background(), "env", "validate", file, "--seeds", "20", "--json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("got %v, want exit status 1\n%s", err, out)
	}
	var v struct {
		OK     bool           `json:"ok"`
		Report envprog.Report `json:"report"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	failed := v.Report.Failed()
	if v.OK || len(failed) != 1 || failed[0].Name != envprog.CheckDoNothing || !strings.Contains(failed[0].Msg, "scores a mean 0.400 over 20 seeds") {
		t.Errorf("failed checks %+v", failed)
	}
}

func TestEnvValidateSyntaxError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "broken.star")
	if err := os.WriteFile(file, []byte("def tools(:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, context.Background(), "env", "validate", file)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(out, "FAIL load: ") || !strings.Contains(out, "broken.star:1:12: got ':', want ')'") {
		t.Errorf("got %v\n%s", err, out)
	}
}

// TestEnvPlayPiped plays seed 5 with the reference solution typed on stdin
// (plus a malformed line, which is refused without ending the episode).
func TestEnvPlayPiped(t *testing.T) {
	ctx := context.Background()
	env, err := envprog.Load(ctx, "x", examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := env.Reset(ctx, 5)
	ref, err := ep.Reference(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	lines = append(lines, `{"name": "get_user_details", "arguments": {`) // malformed
	for _, a := range ref {
		if len(a.ToolCalls) == 0 {
			lines = append(lines, a.Content)
			continue
		}
		lines = append(lines, actionText(a))
	}
	rootCmd.SetIn(strings.NewReader(strings.Join(lines, "\n") + "\n"))
	defer rootCmd.SetIn(nil)
	out, err := runCLI(t, ctx, "env", "play", "example:precondition_airline", "--seed", "5", "--hint")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"── system ──", "<expert_guidance>", "── user ──", ep.Start().User, "not a tool call: unexpected EOF",
		"[get_reservation_details] {\"reservation_id\":", "reward 1  (action=1, communication=1, verified=1)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestEnvPlayScoresWhatWasDone: input that ends before a final answer is
// scored as it stands.
func TestEnvPlayScoresWhatWasDone(t *testing.T) {
	rootCmd.SetIn(strings.NewReader(":hint\n:reference\n"))
	defer rootCmd.SetIn(nil)
	out, err := runCLI(t, context.Background(), "env", "play", "example:precondition_airline", "--seed", "1", "--in-process")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "(input ended: the episode is scored as it stands)") || !strings.Contains(out, "reward 0  (action=0, communication=0, verified=0)") ||
		!strings.Contains(out, `{"name": "get_reservation_details", "arguments": {"reservation_id":`) {
		t.Errorf("output:\n%s", out)
	}
}

// TestEnvPlayRefusesTextAfterACall: a line holding two tool call objects
// (a user's attempt at two calls in one turn without the list) was played
// as its first call, the rest dropped without a word; it is not a tool
// call, and nothing of it is played.
func TestEnvPlayRefusesTextAfterACall(t *testing.T) {
	rootCmd.SetIn(strings.NewReader(`{"name": "get_user_details", "arguments": {"user_id": "x"}} {"name": "get_reservation_details", "arguments": {"reservation_id": "y"}}` + "\n" +
		`[{"name": "get_user_details", "arguments": {"user_id": "x"}}] trailing` + "\n"))
	defer rootCmd.SetIn(nil)
	out, err := runCLI(t, context.Background(), "env", "play", "example:precondition_airline", "--seed", "1", "--in-process")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "[get_user_details]") || strings.Count(out, "not a tool call: ") != 2 {
		t.Errorf("a line with text after its tool call was played, or not refused:\n%s", out)
	}
}

// TestEnvPlayStopsOnInterrupt: Ctrl-C (the command's context ending) while
// play waits for the next turn stops it at once; it waited for another
// line of input, then blamed the program ("reward: the program failed:
// context canceled").
func TestEnvPlayStopsOnInterrupt(t *testing.T) {
	in, w := io.Pipe() // input that never comes
	defer w.Close()
	rootCmd.SetIn(in)
	defer rootCmd.SetIn(nil)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(500 * time.Millisecond)
		cancel()
	}()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runCLI(t, ctx, "env", "play", "example:precondition_airline", "--seed", "1", "--in-process")
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		var ee *exitError
		if !errors.As(r.err, &ee) || ee.code != 130 || !strings.Contains(r.err.Error(), "interrupted") || strings.Contains(r.out, "the program failed") {
			t.Fatalf("got %v, want exit 130 saying interrupted and not blaming the program\n%s", r.err, r.out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("play still waits for input 10 s after its context ended")
	}
}

// TestEnvValidateShowsProgress: a validation that takes long says how far
// it got (every validateProgressEvery; here at every check); it printed
// nothing until its end, minutes later on a slow program.
func TestEnvValidateShowsProgress(t *testing.T) {
	defer func(d time.Duration) { validateProgressEvery = d }(validateProgressEvery)
	validateProgressEvery = 0
	out, err := runCLI(t, context.Background(), "env", "validate", "example:precondition_airline", "--in-process", "--seeds", "5")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"… 1/13 checks (load: pass)", "… 6/13 checks (reset_deterministic: pass)", "… 13/13 checks (hint_is_guidance: pass)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestListsRefuseANegativeLimit: trace env list and trace train list took
// --limit -1 for "all" without a word (a typo for 1, or for 10); it is
// refused naming the flag, before ClickHouse is asked.
func TestListsRefuseANegativeLimit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{{"env", "list", "--limit", "-1"}, {"train", "list", "--limit", "-10"}} {
		out, err := runCLI(t, ctx, args...)
		if err == nil || !strings.Contains(err.Error(), "--limit") {
			t.Errorf("%v: got %v, want an error naming --limit\n%s", args, err, out)
		}
	}
}

// TestEnvPlayHintWithoutHint: --hint on a program without hint() says it
// adds nothing; the episode started unhinted without a word, as if the
// hint were in the system prompt.
func TestEnvPlayHintWithoutHint(t *testing.T) {
	src := strings.Replace(string(examples.PreconditionAirline), "def hint(state):", "def hint_unused(state):", 1)
	path := filepath.Join(t.TempDir(), "nohint.star")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	rootCmd.SetIn(strings.NewReader(":quit\n"))
	defer rootCmd.SetIn(nil)
	out, err := runCLI(t, context.Background(), "env", "play", path, "--seed", "1", "--in-process", "--hint")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "has no hint()") {
		t.Errorf("--hint on a program without hint() said nothing:\n%s", out)
	}
}

// TestEnvCommandsRefuseBadLimits: a negative limit or seed count is a typo
// of the user's, refused naming the flag before any program runs; it was
// accepted and blamed on the program ("does not load", "the reference
// solution scored below 1.0", a calibration verdict of too_hard).
func TestEnvCommandsRefuseBadLimits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing may get as far as running a program or serving
	cmds := map[string][]string{
		"validate":  {"env", "validate", "example:precondition_airline"},
		"play":      {"env", "play", "example:precondition_airline"},
		"serve":     {"env", "serve", "example:precondition_airline", "--addr", "127.0.0.1:0"},
		"calibrate": {"env", "calibrate", "example:precondition_airline", "--policy", "simulated:sim-airline/1.4.0/precondition_verification"},
	}
	bad := []struct{ flag, value string }{
		{"--max-memory", "-1"},
		{"--call-timeout", "-1s"},
		{"--max-turns", "-1"},
		{"--reset-cache", "-2"},
	}
	for name, args := range cmds {
		for _, b := range bad {
			out, err := runCLI(t, ctx, append(append([]string{}, args...), b.flag, b.value)...)
			if err == nil || !strings.Contains(err.Error(), b.flag) {
				t.Errorf("%s %s %s: got %v, want an error naming %s\n%s", name, b.flag, b.value, err, b.flag, out)
			}
		}
	}
	empty := filepath.Join(t.TempDir(), "tools.json")
	if err := os.WriteFile(empty, []byte("[]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, ctx, "env", "validate", "example:precondition_airline", "--tools", empty); err == nil || !strings.Contains(err.Error(), "no tools in it") {
		t.Errorf("validate --tools of an empty list: got %v, want an error\n%s", err, out)
	}
	// The server's own settings are named by their flags too.
	for flag, value := range map[string]string{"--max-sessions": "0", "--step-timeout": "0s", "--max-message-bytes": "10"} {
		out, err := runCLI(t, ctx, "env", "serve", "example:precondition_airline", "--addr", "127.0.0.1:0", flag, value)
		if err == nil || !strings.Contains(err.Error(), flag+": ") || strings.Contains(err.Error(), "env.") {
			t.Errorf("serve %s %s: got %v, want an error naming %s\n%s", flag, value, err, flag, out)
		}
	}
	if out, err := runCLI(t, ctx, "env", "play", "example:precondition_airline", "--seed", "-3"); err == nil || !strings.Contains(err.Error(), "--seed -3") {
		t.Errorf("play --seed -3: got %v, want an error naming --seed\n%s", err, out)
	}
	for _, v := range []string{"0", "-5"} {
		out, err := runCLI(t, ctx, "env", "validate", "example:precondition_airline", "--seeds", v)
		if err == nil || !strings.Contains(err.Error(), "--seeds") {
			t.Errorf("validate --seeds %s: got %v, want an error naming --seeds\n%s", v, err, out)
		}
	}
}

// TestEnvCalibrateNamesItsFlags: a bad calibration setting given on trace
// env calibrate's command line is named by its flag; it was named by the
// configuration's key ("hint_share_min = 0.9 is above hint_share_max", for
// --hint-min and --hint-max; a negative --timeout as "--policy/--model:
// llm config: Timeout").
func TestEnvCalibrateNamesItsFlags(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing may get as far as playing a rollout
	for _, policy := range []string{"simulated:sim-airline/1.4.0/precondition_verification", "http://127.0.0.1:1/v1"} {
		for _, c := range []struct {
			args []string
			want []string
		}{
			{[]string{"--seeds", "0"}, []string{"--seeds"}},
			{[]string{"--rollouts", "-1"}, []string{"--rollouts"}},
			{[]string{"--temperature", "3"}, []string{"--temperature"}},
			{[]string{"--concurrency", "0"}, []string{"--concurrency"}},
			{[]string{"--hint-min", "-0.5"}, []string{"--hint-min"}},
			{[]string{"--hint-max", "1.5"}, []string{"--hint-max"}},
			{[]string{"--hint-min", "0.9", "--hint-max", "0.1"}, []string{"--hint-min", "--hint-max"}},
			{[]string{"--mean-min", "0.9", "--mean-max", "0.1"}, []string{"--mean-min", "--mean-max"}},
			{[]string{"--success-min", "2"}, []string{"--success-min"}},
			{[]string{"--success-max", "-1"}, []string{"--success-max"}},
		} {
			args := append([]string{"env", "calibrate", "example:precondition_airline", "--policy", policy, "--model", "m"}, c.args...)
			out, err := runCLI(t, ctx, args...)
			if err == nil {
				t.Errorf("%v: accepted\n%s", c.args, out)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "calibration") {
					t.Errorf("%v: got %q, want an error naming %s, not the configuration's key", c.args, err, w)
				}
			}
		}
	}
	out, err := runCLI(t, ctx, "env", "calibrate", "example:precondition_airline", "--policy", "http://127.0.0.1:1/v1", "--model", "m", "--timeout", "-1s")
	if err == nil || !strings.Contains(err.Error(), "--timeout") || strings.Contains(err.Error(), "--policy") {
		t.Errorf("--timeout -1s: got %v, want an error naming --timeout\n%s", err, out)
	}
}
