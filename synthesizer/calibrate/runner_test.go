package calibrate

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/envtest"
	"github.com/traceops/trace/synthesizer/envprog"
)

func smallConfig() Config {
	c := DefaultConfig()
	c.Seeds, c.Rollouts = 40, 16
	return c
}

func TestScriptedPoliciesOnGoEnv(t *testing.T) {
	tests := []struct {
		policy  Policy
		verdict string
	}{
		{OraclePolicy{}, TooEasy},
		{RandomPolicy{}, TooHard},
		{SkillPolicy{Skill: 0.4}, Accepted},
	}
	for _, tt := range tests {
		t.Run(policyName(tt.policy), func(t *testing.T) {
			res, err := Run(context.Background(), &envtest.Ledger{}, tt.policy, smallConfig())
			if err != nil {
				t.Fatal(err)
			}
			s := res.Summary
			t.Log(s)
			if s.Verdict != tt.verdict {
				t.Fatalf("verdict %s, want %s: %s", s.Verdict, tt.verdict, s)
			}
			if !s.Simulated || !strings.HasPrefix(s.String(), "[SIMULATED]") || !strings.HasPrefix(s.Policy, "scripted-") {
				t.Errorf("a scripted policy's summary is not labeled simulated: %s", s)
			}
			if tt.verdict == TooEasy && (s.Mean != 1 || s.SuccessRate != 1) {
				t.Errorf("oracle: mean %v success %v, want 1 and 1", s.Mean, s.SuccessRate)
			}
		})
	}
}

// recorder wraps a policy and keeps what each turn showed it.
type recorder struct {
	Policy
	mu    sync.Mutex
	turns []Turn
}

func (r *recorder) Act(ctx context.Context, t Turn) (envprog.Action, error) {
	r.mu.Lock()
	r.turns = append(r.turns, t)
	r.mu.Unlock()
	return r.Policy.Act(ctx, t)
}

func TestHintBlockOnHintedRollouts(t *testing.T) {
	cfg := smallConfig()
	cfg.Seeds = 30
	rec := &recorder{Policy: OraclePolicy{}}
	res, err := Run(context.Background(), &envtest.Ledger{}, rec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range rec.turns {
		sys := tr.Messages[0].Content
		if has := strings.Contains(sys, envprog.HintOpen+"\nMake every change") && strings.HasSuffix(sys, envprog.HintClose); has != tr.Hinted {
			t.Fatalf("seed %d rollout %d turn %d: hinted %v, system prompt %q", tr.Seed, tr.Rollout, tr.Index, tr.Hinted, sys)
		}
		if StripHint(sys) != "You manage a to-do ledger." {
			t.Fatalf("StripHint left %q", StripHint(sys))
		}
		if tr.Temperature != 0.7 {
			t.Fatalf("temperature %v passed to the policy, want 0.7", tr.Temperature)
		}
	}
	// ceil(share × 16) with share in [0.25, 0.5]: 4..8 hinted rollouts per
	// group, and the rollouts recorded as hinted are those the policy saw.
	seen := map[int]bool{}
	for gi, g := range res.Groups {
		n := 0
		for ri, h := range g.Hinted {
			if h {
				n++
			}
			if res.Rollouts[gi][ri].Hinted != h {
				t.Fatalf("seed %d rollout %d: result and group disagree on the hint", g.Seed, ri)
			}
		}
		if n < 4 || n > 8 {
			t.Errorf("seed %d: %d hinted rollouts of 16, want 4..8", g.Seed, n)
		}
		seen[n] = true
	}
	if len(seen) < 3 {
		t.Errorf("hinted counts per group %v: the share is not drawn per group", seen)
	}
	if res.Summary.HintedRollouts == 0 {
		t.Error("summary counts no hinted rollouts")
	}
}

func TestNoHintWithoutHintFunction(t *testing.T) {
	rec := &recorder{Policy: OraclePolicy{}}
	cfg := smallConfig()
	cfg.Seeds = 5
	res, err := Run(context.Background(), &envtest.Ledger{NoHint: true}, rec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range rec.turns {
		if tr.Hinted || strings.Contains(tr.Messages[0].Content, envprog.HintOpen) {
			t.Fatalf("a hint was shown for an environment without hint()")
		}
	}
	if res.Summary.HintedRollouts != 0 {
		t.Errorf("hinted rollouts = %d, want 0", res.Summary.HintedRollouts)
	}
}

func TestHintedRolloutsDeterministic(t *testing.T) {
	for seed := int64(0); seed < 50; seed++ {
		a := HintedRollouts(seed, 16, 0.25, 0.5)
		if !reflect.DeepEqual(a, HintedRollouts(seed, 16, 0.25, 0.5)) {
			t.Fatalf("seed %d: two draws differ", seed)
		}
	}
	if n := count(HintedRollouts(3, 16, 0, 0)); n != 0 {
		t.Errorf("share 0: %d hinted", n)
	}
	if n := count(HintedRollouts(3, 16, 1, 1)); n != 16 {
		t.Errorf("share 1: %d hinted", n)
	}
	if n := count(HintedRollouts(3, 10, 0.25, 0.25)); n != 3 {
		t.Errorf("share 0.25 of 10: %d hinted, want ceil(2.5) = 3", n)
	}
}

func count(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

func TestRunDeterministicAcrossConcurrency(t *testing.T) {
	cfg := smallConfig()
	cfg.Seeds = 12
	cfg.Concurrency = 1
	a, err := Run(context.Background(), &envtest.Ledger{}, SkillPolicy{Skill: 0.4}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Concurrency = 8
	b, err := Run(context.Background(), &envtest.Ledger{}, SkillPolicy{Skill: 0.4}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Groups, b.Groups) {
		t.Error("the same run with concurrency 1 and 8 gave different groups")
	}
}

func TestProgressAndConcurrencyBound(t *testing.T) {
	cfg := smallConfig()
	cfg.Seeds, cfg.Rollouts, cfg.Concurrency = 6, 4, 3
	var calls []Progress
	cfg.Progress = func(p Progress) { calls = append(calls, p) } // never concurrent
	var inflight, peak atomic.Int64
	pol := PolicyFunc(func(ctx context.Context, t Turn) (envprog.Action, error) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		return OraclePolicy{}.Act(ctx, t)
	})
	if _, err := Run(context.Background(), &envtest.Ledger{}, pol, cfg); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 24 || calls[23] != (Progress{Done: 24, Total: 24}) {
		t.Fatalf("progress calls %v, want 24 ending at 24/24", calls)
	}
	for i, p := range calls {
		if p.Done != i+1 {
			t.Fatalf("progress %d reports %d done", i, p.Done)
		}
	}
	if p := peak.Load(); p > 3 || p < 2 {
		t.Errorf("peak concurrent turns %d, want 2..3 with concurrency 3", p)
	}
}

func TestRunCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var started atomic.Int64
	pol := PolicyFunc(func(ctx context.Context, t Turn) (envprog.Action, error) {
		if started.Add(1) == 3 {
			cancel()
		}
		<-ctx.Done()
		return envprog.Action{}, ctx.Err()
	})
	env := &envtest.Ledger{}
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, env, pol, DefaultConfig())
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want one wrapping context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if n := env.Resets.Load(); n > 16 {
		t.Errorf("%d episodes started after cancellation at the 3rd turn (concurrency 4)", n)
	}
}

func TestRunPolicyErrorNamesRollout(t *testing.T) {
	boom := errors.New("model endpoint is gone")
	pol := PolicyFunc(func(ctx context.Context, t Turn) (envprog.Action, error) {
		if t.Seed == 2 && t.Rollout == 3 {
			return envprog.Action{}, boom
		}
		return OraclePolicy{}.Act(ctx, t)
	})
	cfg := smallConfig()
	cfg.Seeds, cfg.Rollouts, cfg.Concurrency = 4, 4, 1
	_, err := Run(context.Background(), &envtest.Ledger{}, pol, cfg)
	var re *RolloutError
	if !errors.As(err, &re) || re.Seed != 2 || re.Rollout != 3 || !errors.Is(err, boom) {
		t.Fatalf("error %v, want a RolloutError for seed 2 rollout 3 wrapping the policy's", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if d.Seeds != 100 || d.Rollouts != 16 || d.Temperature != 0.7 || d.HintShareMin != 0.25 || d.HintShareMax != 0.5 {
		t.Errorf("defaults %+v are not the release's 100 × 16 at 0.7, hints 0.25–0.5", d)
	}
	tests := []struct {
		field string
		set   func(*Config)
	}{
		{"seeds", func(c *Config) { c.Seeds = 0 }},
		{"rollouts", func(c *Config) { c.Rollouts = -1 }},
		{"temperature", func(c *Config) { c.Temperature = 3 }},
		{"concurrency", func(c *Config) { c.Concurrency = 0 }},
		{"hint_share_min", func(c *Config) { c.HintShareMin = -0.1 }},
		{"hint_share_max", func(c *Config) { c.HintShareMax = 1.5 }},
		{"hint_share_min = 0.6 is above", func(c *Config) { c.HintShareMin = 0.6 }},
		{"max_turns", func(c *Config) { c.MaxTurns = 0 }},
		{"min_std", func(c *Config) { c.Bands.MinStd = -1 }},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		tt.set(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: error %v", tt.field, err)
		}
		if _, err := Run(context.Background(), &envtest.Ledger{}, OraclePolicy{}, c); err == nil {
			t.Errorf("%s: Run accepted the bad config", tt.field)
		}
	}
}

func TestStripHint(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{WithHint("policy text", "check first"), "policy text"},
		{WithHint("ends with newline\n", "x"), "ends with newline\n"},
		{WithHint(WithHint("a", "one"), "two"), "a"},
		{"a " + envprog.HintOpen + "inline" + envprog.HintClose + " b", "a  b"},
		{"cut " + envprog.HintOpen + " never closed", "cut "},
		{WithHint("a", "   "), "a"},
	}
	for _, tt := range tests {
		if got := StripHint(tt.in); got != tt.want {
			t.Errorf("StripHint(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	msgs := []envprog.Message{{Role: "system", Content: WithHint("s", "h")}, {Role: "user", Content: "u " + envprog.HintOpen}}
	out := StripHints(msgs)
	if out[0].Content != "s" || out[1].Content != msgs[1].Content || msgs[0].Content == "s" {
		t.Errorf("StripHints: %+v (input now %+v)", out, msgs)
	}
}
