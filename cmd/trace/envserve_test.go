package main

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/testenv"
	"github.com/traceops/trace/synthesizer/envclient"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
	"github.com/traceops/trace/synthesizer/openenv"
)

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

// TestEnvServeProcess runs `trace env serve` as a process (sandboxed
// program, token, --record), plays the example's reference solution through
// it, sends SIGTERM and expects exit 0 with the episode in env_episodes.
func TestEnvServeProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	ch := testenv.ClickHouse(t)
	args := []string{"env", "serve", "example:precondition_airline", "--addr", "127.0.0.1:0", "--token", "tok", "--record",
		"--set", "clickhouse.addr=" + ch.Addr, "--set", "clickhouse.database=" + ch.Database}
	cmd, base := serveProcess(t, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The reference solution for seed 4, computed in-process.
	env, err := envprog.Load(ctx, examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	ep, _ := env.Reset(ctx, 4)
	ref, _ := ep.Reference(ctx)

	s, err := envclient.New(base, "tok").Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seed := int64(4)
	if _, err := s.Reset(ctx, openenv.ResetRequest{Seed: &seed}); err != nil {
		t.Fatal(err)
	}
	var obs openenv.StepResponse
	for _, a := range ref {
		m := openenv.ChatMessage{Role: "assistant", Content: a.Content}
		for _, c := range a.ToolCalls {
			m.ToolCalls = append(m.ToolCalls, openenv.ChatToolCall{ID: "c", Type: "function", Function: openenv.ChatFunction{Name: c.Name, Arguments: string(c.Arguments)}})
		}
		if obs, err = s.Step(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if !obs.Done || obs.Reward == nil || *obs.Reward != 1 {
		t.Fatalf("the reference through trace env serve: %+v", obs)
	}
	if err := terminate(t, cmd, 30*time.Second, new(strings.Builder)); err != nil { // its log went to stderr
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	var n uint64
	var reward float64
	if err := ch.Conn().QueryRow(ctx, "SELECT count(), any(reward) FROM env_episodes WHERE seed = 4").Scan(&n, &reward); err != nil {
		t.Fatal(err)
	}
	if n != 1 || reward != 1 {
		t.Fatalf("env_episodes after the drain: %d rows, reward %v; want the one episode with reward 1", n, reward)
	}
}

// TestEnvServeTakesTheConfiguredEnvToken: without --token, trace env serve
// protects the environments with env.bearer_token, else http.bearer_token,
// as the serve role does. It took http.bearer_token alone, so a
// configuration that set the environment server's own token served the
// environments with the dashboard's token, or with none at all.
func TestEnvServeTakesTheConfiguredEnvToken(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sets       []string
		want, deny []string // tokens answered 200 / 401; "" is no token
	}{
		{"env token", []string{"env.bearer_token=envtok"}, []string{"envtok"}, []string{""}},
		{"both", []string{"env.bearer_token=envtok", "http.bearer_token=httptok"}, []string{"envtok"}, []string{"", "httptok"}},
		{"http token", []string{"http.bearer_token=httptok"}, []string{"httptok"}, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"env", "serve", "example:precondition_airline", "--in-process", "--addr", "127.0.0.1:0"}
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}
			_, base := serveProcess(t, args...)
			status := func(token string) int {
				req, _ := http.NewRequest("GET", base+"/schema", nil)
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			for _, tok := range tc.want {
				if got := status(tok); got != http.StatusOK {
					t.Errorf("token %q: status %d, want 200", tok, got)
				}
			}
			for _, tok := range tc.deny {
				if got := status(tok); got != http.StatusUnauthorized {
					t.Errorf("token %q: status %d, want 401", tok, got)
				}
			}
		})
	}
}

// serveProcess starts `trace env serve` with args as a process (its log on
// stderr), killed at the test's end, and returns it and the base URL its
// serving line names (the example environment's).
func serveProcess(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := traceProcess(args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	re := regexp.MustCompile(`serving precondition_airline at (\S+)`)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() {
				for sc.Scan() {
				}
			}()
			return cmd, m[1]
		}
	}
	t.Fatal("no serving line")
	return nil, ""
}
