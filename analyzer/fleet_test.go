package analyzer

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"testing"

	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/schemas"
)

// TestFleetSelection is the end-to-end check of the rules labeler against
// the simulator: ~3,000 rollouts of simulate.DefaultFleet are labeled with
// the built-in tau-tools dictionary, counted per (environment, agent
// version) cohort (N = 1 run), and analyzer.Select (ρ 0.10, δ 0.20, K 1)
// must select exactly the deficits planted in each cohort, with real margins.
func TestFleetSelection(t *testing.T) {
	const rollouts = 3000
	fleet := simulate.DefaultFleet()
	dicts := builtinByEnv(t)
	lab := NewRulesLabeler(RulesOptions{})
	th := DefaultThresholds
	th.K = 1

	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			type cohort struct{ env, version string }
			counts := map[cohort]map[string]*Counts{}
			lackingFailed := map[cohort]map[string][]string{}
			agree, pairs := 0, 0
			mismatches := map[string]int{}
			g := simulate.New(simulate.Config{Seed: seed, Rollouts: rollouts})
			for r := g.Next(); r != nil; r = g.Next() {
				// Label what a consumer would see: the decoded JSON.
				b, err := json.Marshal(r)
				if err != nil {
					t.Fatal(err)
				}
				// (internal/dev/simulate's tests validate every rollout against the
				// schema; a plain decode keeps this test fast.)
				dec := &schemas.Rollout{}
				if err := json.Unmarshal(b, dec); err != nil {
					t.Fatalf("rollout %s does not decode: %v", r.RolloutID, err)
				}
				d := dicts[dec.Environment]
				runs, err := lab.Label(context.Background(), d, dec)
				if err != nil {
					t.Fatal(err)
				}
				if len(runs) != 1 || runs[0].Failed != "" {
					t.Fatalf("rollout %s: run failed: %+v", r.RolloutID, runs)
				}
				truth, ok := simulate.TruthOf(dec)
				if !ok {
					t.Fatalf("rollout %s has no ground truth", r.RolloutID)
				}
				k := cohort{dec.Environment, dec.Agent.Version}
				if counts[k] == nil {
					counts[k] = map[string]*Counts{}
					lackingFailed[k] = map[string][]string{}
				}
				for _, c := range d.Capabilities {
					l := runs[0].Labels[c.Name]
					pairs++
					if l == truth.Labels[c.Name] {
						agree++
					} else {
						mismatches[fmt.Sprintf("%s %s: rules %s, truth %s", truth.TaskKind, c.Name, l, truth.Labels[c.Name])]++
					}
					cnt := counts[k][c.Name]
					if cnt == nil {
						cnt = &Counts{}
						counts[k][c.Name] = cnt
					}
					failed := !dec.Succeeded()
					switch {
					case l == schemas.LabelLacking && failed:
						cnt.LackingFailed++
						lackingFailed[k][c.Name] = append(lackingFailed[k][c.Name], dec.RolloutID)
					case l == schemas.LabelPresent && failed:
						cnt.PresentFailed++
					case l == schemas.LabelNA && failed:
						cnt.NAFailed++
					case l == schemas.LabelLacking:
						cnt.LackingPassed++
					case l == schemas.LabelPresent:
						cnt.PresentPassed++
					default:
						cnt.NAPassed++
					}
				}
			}

			rate := float64(agree) / float64(pairs)
			t.Logf("rules labels agree with the planted ground truth on %d of %d (rollout, capability) pairs (%.2f%%)", agree, pairs, 100*rate)
			for _, m := range slices.Sorted(maps.Keys(mismatches)) {
				t.Logf("  mismatch ×%d: %s", mismatches[m], m)
			}
			if rate < 0.95 {
				t.Errorf("agreement %.4f < 0.95", rate)
			}

			keys := slices.SortedFunc(maps.Keys(counts), func(a, b cohort) int {
				if a.env != b.env {
					return cmpStr(a.env, b.env)
				}
				return cmpStr(a.version, b.version)
			})
			if len(keys) != 3 {
				t.Fatalf("want 3 cohorts, got %v", keys)
			}
			for _, k := range keys {
				planted := plantedIn(fleet, k.env, k.version)
				var caps []CapabilityRuns
				for _, c := range dicts[k.env].Capabilities {
					caps = append(caps, CapabilityRuns{Name: c.Name, Runs: []RunInput{{Counts: *counts[k][c.Name], LackingFailedIDs: lackingFailed[k][c.Name]}}})
				}
				res := Select(caps, th)
				var selected []string
				for _, r := range res {
					s := r.PerRun[0]
					c := counts[k][r.Name]
					t.Logf("%s %s %-26s Δ=%+.3f Cov=%.3f ER−=%.3f ER+=%.3f  L−=%d P−=%d N−=%d L+=%d P+=%d N+=%d  selected=%v planted=%v",
						k.env, k.version, r.Name, s.Delta, s.Cov, s.ERFailed, s.ERPassed,
						c.LackingFailed, c.PresentFailed, c.NAFailed, c.LackingPassed, c.PresentPassed, c.NAPassed,
						r.Selected, slices.Contains(planted, r.Name))
					if r.Selected {
						selected = append(selected, r.Name)
					}
					if slices.Contains(planted, r.Name) {
						if s.Delta < 0.4 {
							t.Errorf("%s/%s: planted %s has Δ %.3f < 0.4", k.env, k.version, r.Name, s.Delta)
						}
						if len(r.Examples) == 0 {
							t.Errorf("%s/%s: planted %s has no example failures", k.env, k.version, r.Name)
						}
					} else if s.Delta > 0.1 {
						t.Errorf("%s/%s: non-planted %s has Δ %.3f > 0.1", k.env, k.version, r.Name, s.Delta)
					}
				}
				sort.Strings(selected)
				if !slices.Equal(selected, planted) {
					t.Errorf("%s/%s: selected %v, planted %v", k.env, k.version, selected, planted)
				}
			}
		})
	}
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// plantedIn lists, sorted, the capabilities with a deficit rate > 0 in a
// cohort of the fleet.
func plantedIn(fleet []simulate.AgentSpec, env, version string) []string {
	out := []string{}
	for _, a := range fleet {
		if a.Version != version || !slices.Contains(a.Environments, env) {
			continue
		}
		for c, p := range a.Deficits {
			if p > 0 {
				out = append(out, c)
			}
		}
	}
	sort.Strings(out)
	return out
}

func builtinByEnv(t *testing.T) map[string]*Dictionary {
	t.Helper()
	ds, err := BuiltinDictionaries()
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry()
	for _, d := range ds {
		reg.Put(d)
	}
	out := map[string]*Dictionary{}
	for _, env := range simulate.Environments {
		if out[env] = reg.Resolve(env, "1.4.0"); out[env] == nil {
			t.Fatalf("no built-in dictionary for %s", env)
		}
	}
	return out
}

// TestRulesAgreeWithSimulator labels a fleet in which every capability is
// planted (alone, and all together, so that deficits interact) and checks the
// rules labels against the simulator's ground truth.
func TestRulesAgreeWithSimulator(t *testing.T) {
	both := simulate.Environments
	fleet := []simulate.AgentSpec{
		{Name: "p", Version: "1", Environments: both, Deficits: map[string]float64{simulate.PreconditionVerification: 0.4}},
		{Name: "g", Version: "2", Environments: both, Deficits: map[string]float64{simulate.ArgumentGrounding: 0.4}},
		{Name: "m", Version: "3", Environments: both, Deficits: map[string]float64{simulate.MultiStepCompletion: 0.4}},
		{Name: "e", Version: "4", Environments: both, Deficits: map[string]float64{simulate.ToolErrorRecovery: 0.5}},
		{Name: "c", Version: "5", Environments: both, Deficits: map[string]float64{simulate.UserConfirmation: 0.4}},
		{Name: "x", Version: "6", Environments: both, Deficits: map[string]float64{
			simulate.PreconditionVerification: 0.5, simulate.ArgumentGrounding: 0.5, simulate.MultiStepCompletion: 0.5,
			simulate.ToolErrorRecovery: 0.5, simulate.UserConfirmation: 0.5}},
	}
	dicts := builtinByEnv(t)
	lab := NewRulesLabeler(RulesOptions{})
	g := simulate.New(simulate.Config{Seed: 42, Fleet: fleet, Rollouts: 1500})
	agree, pairs, logged := 0, 0, 0
	perCap := map[string][2]int{}
	for r := g.Next(); r != nil; r = g.Next() {
		runs, err := lab.Label(context.Background(), dicts[r.Environment], r)
		if err != nil || runs[0].Failed != "" {
			t.Fatalf("%s: %v %+v", r.RolloutID, err, runs)
		}
		truth, _ := simulate.TruthOf(r)
		for c, l := range runs[0].Labels {
			pairs++
			x := perCap[c]
			x[1]++
			if l == truth.Labels[c] {
				agree++
				x[0]++
			} else if logged++; logged <= 20 {
				t.Logf("mismatch %s %s (%s): rules %s, truth %s", r.RolloutID, c, truth.TaskKind, l, truth.Labels[c])
			}
			perCap[c] = x
		}
	}
	for _, c := range slices.Sorted(maps.Keys(perCap)) {
		t.Logf("%-26s agree %d of %d", c, perCap[c][0], perCap[c][1])
	}
	if rate := float64(agree) / float64(pairs); rate < 0.95 {
		t.Errorf("agreement %.4f < 0.95", rate)
	}
}
