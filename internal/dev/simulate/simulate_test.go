package simulate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/schemas"
)

func jsonl(t *testing.T, cfg Config) []byte {
	t.Helper()
	var buf bytes.Buffer
	for r := range New(cfg).All() {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

func TestDeterminism(t *testing.T) {
	a := jsonl(t, Config{Seed: 7, Rollouts: 300})
	b := jsonl(t, Config{Seed: 7, Rollouts: 300})
	if !bytes.Equal(a, b) {
		t.Fatal("the same seed gave different bytes")
	}
	c := jsonl(t, Config{Seed: 8, Rollouts: 300})
	if bytes.Equal(a, c) {
		t.Fatal("different seeds gave the same bytes")
	}
	// Every rollout differs between the seeds, not just a few.
	la, lc := bytes.Split(a, []byte("\n")), bytes.Split(c, []byte("\n"))
	same := 0
	for i := range la {
		if len(la[i]) > 0 && bytes.Equal(la[i], lc[i]) {
			same++
		}
	}
	if same > 0 {
		t.Errorf("%d rollouts are identical across seeds", same)
	}
	// Random access agrees with Next.
	g := New(Config{Seed: 7})
	r, _ := json.Marshal(g.Rollout(123))
	if !bytes.Equal(r, la[123]) {
		t.Error("Rollout(123) differs from the 124th Next")
	}
	// Ids are deterministic, uuid-shaped and unique.
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i := range 1000 {
		id := RolloutID(7, i)
		if !uuid.MatchString(id) || seen[id] || id != RolloutID(7, i) {
			t.Fatalf("RolloutID(7, %d) = %s", i, id)
		}
		seen[id] = true
	}
	if RolloutID(7, 0) == RolloutID(8, 0) {
		t.Error("rollout ids do not depend on the seed")
	}
	// Next stops after Rollouts; All resumes where Next stopped.
	g = New(Config{Seed: 1, Rollouts: 3})
	g.Next()
	n := 0
	for range g.All() {
		n++
	}
	if n != 2 || g.Next() != nil {
		t.Errorf("All after one Next gave %d rollouts", n)
	}
}

func TestConcurrentRollout(t *testing.T) {
	g := New(Config{Seed: 9, Fleet: allDeficits()})
	want := make([][]byte, 200)
	for i := range want {
		want[i], _ = json.Marshal(g.Rollout(i))
	}
	done := make(chan error)
	for w := range 4 {
		go func() {
			for i := w; i < len(want); i += 4 {
				b, _ := json.Marshal(g.Rollout(i))
				if !bytes.Equal(b, want[i]) {
					done <- fmt.Errorf("rollout %d differs when generated concurrently", i)
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// allDeficits plants every capability, one per agent, so that each rate can
// be measured on its own.
func allDeficits() []AgentSpec {
	both := []string{Airline, Retail}
	return []AgentSpec{
		{Name: "p", Version: "1", Environments: both, Deficits: map[string]float64{PreconditionVerification: 0.3}},
		{Name: "g", Version: "2", Environments: both, Deficits: map[string]float64{ArgumentGrounding: 0.6}},
		{Name: "m", Version: "3", Environments: both, Deficits: map[string]float64{MultiStepCompletion: 0.4}},
		{Name: "e", Version: "4", Environments: both, Deficits: map[string]float64{ToolErrorRecovery: 0.5}},
		{Name: "c", Version: "5", Environments: both, Deficits: map[string]float64{UserConfirmation: 0.25}},
		{Name: "x", Version: "6", Environments: both, Deficits: map[string]float64{
			PreconditionVerification: 0.5, ArgumentGrounding: 0.5, MultiStepCompletion: 0.5, ToolErrorRecovery: 0.5, UserConfirmation: 0.5}},
		{Name: "ok", Version: "7", Environments: both},
	}
}

func TestRolloutsAreValid(t *testing.T) {
	for _, fleet := range [][]AgentSpec{DefaultFleet(), allDeficits()} {
		cfg := Config{Seed: 3, Fleet: fleet, Rollouts: 2000, Start: time.Date(2026, 1, 5, 8, 0, 0, 0, time.UTC), Interval: time.Minute}
		g := New(cfg)
		i := 0
		for r := range g.All() {
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := schemas.DecodeRollout(b, schemas.DecodeOptions{})
			if err != nil {
				t.Fatalf("rollout %d (%s) does not decode: %v\n%s", i, r.RolloutID, err, b)
			}
			checkRollout(t, dec, cfg, i)
			i++
		}
		if i != cfg.Rollouts {
			t.Fatalf("got %d rollouts", i)
		}
	}
}

func checkRollout(t *testing.T, r *schemas.Rollout, cfg Config, i int) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("rollout %d (%s, %s task %s): %s", i, r.RolloutID, r.Environment, r.TaskID, fmt.Sprintf(format, args...))
	}
	if r.Schema != "rollout/v1" || r.Key() != r.Environment+"/"+r.Agent.Version {
		fail("schema %q", r.Schema)
	}
	start := cfg.Start.Add(time.Duration(i) * cfg.Interval)
	if r.StartTime.Before(start) || r.StartTime.After(start.Add(20*time.Second)) || !r.EndTime.After(r.StartTime) {
		fail("times %s .. %s", r.StartTime, r.EndTime)
	}
	if !slices.Contains([]float64{0, 0.5, 1}, r.Outcome.Reward) || r.Outcome.Success != nil {
		fail("reward %v", r.Outcome.Reward)
	}
	if r.Grader == nil || (r.Grader.Breakdown["DB"]+r.Grader.Breakdown["COMMUNICATE"])/2 != r.Outcome.Reward {
		fail("grader %+v", r.Grader)
	}
	if (len(r.Grader.Reasons) == 0) != r.Succeeded() {
		fail("reasons %v on success=%v", r.Grader.Reasons, r.Succeeded())
	}
	tools := map[string]bool{}
	for _, tl := range r.Tools {
		tools[tl.Function.Name] = true
	}
	// Conversation shape.
	ms := r.Messages
	if ms[0].Role != "system" || ms[1].Role != "assistant" || ms[2].Role != "user" {
		fail("starts with %s, %s, %s", ms[0].Role, ms[1].Role, ms[2].Role)
	}
	last := ms[len(ms)-1]
	if last.Role != "user" || !(strings.HasSuffix(last.Content, "###STOP###") || last.Content == "###TRANSFER###") {
		fail("ends with %s %q", last.Role, last.Content)
	}
	// tool_call_id consistency: every call is answered by the next tool
	// messages, in order; every tool message answers a call; ids are unique.
	ids := map[string]bool{}
	for j := 0; j < len(ms); j++ {
		m := ms[j]
		if m.TurnIdx == nil && j > 0 || m.TurnIdx != nil && *m.TurnIdx != j-1 {
			fail("message %d has turn_idx %v", j, m.TurnIdx)
		}
		switch m.Role {
		case "tool":
			fail("message %d: tool message %q answers no pending call", j, m.ToolCallID)
		case "assistant":
			for k, tc := range m.ToolCalls {
				if ids[tc.ID] || !strings.HasPrefix(tc.ID, "call_") {
					fail("call id %q repeated or malformed", tc.ID)
				}
				ids[tc.ID] = true
				if !tools[tc.Name] {
					fail("call of %s, which is not among the rollout's tools", tc.Name)
				}
				res := ms[j+1+k]
				if res.Role != "tool" || res.ToolCallID != tc.ID || res.Requestor != "assistant" || tc.Requestor != "assistant" {
					fail("call %s (%s) is answered by %+v", tc.ID, tc.Name, res)
				}
				if res.Error != strings.HasPrefix(res.Content, "Error:") {
					fail("tool result error flag %v for %q", res.Error, res.Content)
				}
				if res.Content == "" {
					fail("empty tool result for %s", tc.Name)
				}
			}
			j += len(m.ToolCalls)
		}
	}
	// Metadata and ground truth.
	truth, ok := TruthOf(r)
	if !ok || truth.Index != i || truth.Seed != fmt.Sprint(cfg.Seed) {
		fail("truth %+v", truth)
	}
	req, _ := r.Metadata["required_actions"].([]any)
	if len(req) == 0 || r.Metadata["task_ref"] != r.Environment+":"+r.TaskID {
		fail("metadata %v", r.Metadata)
	}
	for _, c := range Capabilities {
		l := truth.Labels[c]
		switch {
		case !slices.Contains([]string{LabelNA, LabelPresent, LabelLacking}, l):
			fail("label %s = %q", c, l)
		case (l == LabelLacking) != slices.Contains(truth.Lacking, c):
			fail("%s labeled %s but lacking = %v", c, l, truth.Lacking)
		case slices.Contains(truth.Planted, c) && l != LabelLacking:
			fail("%s planted but labeled %s", c, l)
		case !slices.Contains(truth.Needed, c) && l != LabelNA:
			fail("%s not needed but labeled %s", c, l)
		}
	}
	if (truth.FailureCause == "") != r.Succeeded() || truth.FailureCause == "planted" && len(truth.Planted) == 0 {
		fail("failure cause %q, success %v, planted %v", truth.FailureCause, r.Succeeded(), truth.Planted)
	}
}

func TestPlantedRates(t *testing.T) {
	fleet := allDeficits()
	g := New(Config{Seed: 11, Fleet: fleet, Rollouts: 2000})
	type tally struct{ needed, drawn, planted int }
	rates := map[string]map[string]*tally{} // agent version -> capability
	var failPlanted, nPlanted, failClean, nClean int
	var kinds = map[string]int{}
	var readOnly, multi, toolErr, n int
	for r := range g.All() {
		truth, _ := TruthOf(r)
		v := r.Agent.Version
		if rates[v] == nil {
			rates[v] = map[string]*tally{}
		}
		for _, c := range truth.Needed {
			if rates[v][c] == nil {
				rates[v][c] = &tally{}
			}
			rates[v][c].needed++
		}
		for _, c := range truth.Drawn {
			if !slices.Contains(truth.Needed, c) {
				t.Fatalf("%s drawn but not needed", c)
			}
			rates[v][c].drawn++
		}
		for _, c := range truth.Planted {
			if !slices.Contains(truth.Drawn, c) {
				t.Fatalf("%s planted but not drawn", c)
			}
			rates[v][c].planted++
		}
		if len(truth.Planted) > 0 {
			nPlanted++
			if !r.Succeeded() {
				failPlanted++
			}
		} else {
			nClean++
			if !r.Succeeded() {
				failClean++
			}
		}
		kinds[r.Environment+" "+truth.TaskKind]++
		n++
		if !slices.Contains(truth.Needed, PreconditionVerification) {
			readOnly++
		}
		if slices.Contains(truth.Needed, MultiStepCompletion) {
			multi++
		}
		if truth.ToolError != "" {
			toolErr++
		}
	}
	for _, a := range fleet {
		for _, c := range Capabilities {
			p := a.Deficits[c]
			tl := rates[a.Version][c]
			if tl == nil || tl.needed < 50 {
				t.Fatalf("agent %s: too few episodes need %s: %+v", a.Version, c, tl)
			}
			got := float64(tl.drawn) / float64(tl.needed)
			tol := 4*math.Sqrt(p*(1-p)/float64(tl.needed)) + 1e-9
			t.Logf("agent %s %-26s drawn %4d, planted %4d of %4d = %.3f (configured %.2f ± %.3f)", a.Version, c, tl.drawn, tl.planted, tl.needed, got, p, tol)
			if math.Abs(got-p) > tol {
				t.Errorf("agent %s: %s drawn at %.3f, configured %.2f", a.Version, c, got, p)
			}
			// With a single deficit nothing can hide it.
			if len(a.Deficits) == 1 && tl.planted != tl.drawn {
				t.Errorf("agent %s: %s drawn %d times but showed %d times", a.Version, c, tl.drawn, tl.planted)
			}
		}
	}
	pf, cf := float64(failPlanted)/float64(nPlanted), float64(failClean)/float64(nClean)
	t.Logf("P(fail | planted) = %.3f over %d, P(fail | none) = %.3f over %d", pf, nPlanted, cf, nClean)
	if math.Abs(pf-0.9) > 0.05 || math.Abs(cf-0.1) > 0.04 {
		t.Errorf("failure rates %.3f / %.3f, want about 0.9 / 0.1", pf, cf)
	}
	t.Logf("read-only %.2f, multi-write %.2f, tool error %.2f; kinds %v", float64(readOnly)/float64(n), float64(multi)/float64(n), float64(toolErr)/float64(n), kinds)
	for _, x := range []struct {
		name      string
		got, want float64
	}{{"read-only", float64(readOnly) / float64(n), shareReadOnly}, {"multi-write", float64(multi) / float64(n), shareMulti}, {"tool error", float64(toolErr) / float64(n), shareToolError}} {
		if math.Abs(x.got-x.want) > 0.06 {
			t.Errorf("%s share %.3f, want about %.2f", x.name, x.got, x.want)
		}
	}
	for _, env := range Environments {
		if g.Tasks(env) == 0 {
			t.Errorf("no tasks for %s", env)
		}
	}
}

func TestOutcomeModel(t *testing.T) {
	g := New(Config{Seed: 2, Rollouts: 400, Fleet: allDeficits(), Outcomes: &OutcomeModel{FailIfLacking: 1, BaseFailure: 0}})
	for r := range g.All() {
		truth, _ := TruthOf(r)
		if r.Succeeded() == (len(truth.Planted) > 0) {
			t.Fatalf("planted %v but success %v", truth.Planted, r.Succeeded())
		}
	}
}

func TestFleetYAML(t *testing.T) {
	b, err := MarshalFleet(DefaultFleet())
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseFleet(b)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(DefaultFleet()) {
		t.Errorf("round trip:\n%v\n%v", got, DefaultFleet())
	}
	bad := []struct{ yaml, want string }{
		{"agents: []", "no agents"},
		{"agents: [{name: a, version: '1'}]", "at least one environment"},
		{"agents: [{name: a, version: '1', environments: [mars]}]", `unknown environment "mars"`},
		{"agents: [{name: a, version: '1', environments: [sim-retail], deficits: {politeness: 0.5}}]", `unknown capability "politeness"`},
		{"agents: [{name: a, version: '1', environments: [sim-retail], deficits: {user_confirmation: 1.5}}]", "want a probability"},
		{"agents: [{name: a, version: '1', environments: [sim-retail]}, {name: b, version: '1', environments: [sim-retail]}]", "served by two agents"},
		{"agents: [{name: a, version: '1', environments: [sim-retail], colour: red}]", "field colour not found"},
	}
	for _, tc := range bad {
		if _, err := ParseFleet([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFleet(%s) = %v, want %q", tc.yaml, err, tc.want)
		}
	}
	if err := (Config{Rollouts: -1}).Validate(); err == nil {
		t.Error("negative rollouts accepted")
	}
	defer func() {
		if recover() == nil {
			t.Error("New accepted an invalid fleet")
		}
	}()
	New(Config{Fleet: []AgentSpec{{Name: "a"}}})
}

func TestPyJSON(t *testing.T) {
	got := pyJSON(obj{{"a", 1}, {"b", 2.0}, {"c", 157.61}, {"d", []string{"x"}}, {"e", nil}, {"f", true}, {"g", []obj{{{"h", "é\"q"}}}}})
	want := `{"a": 1, "b": 2.0, "c": 157.61, "d": ["x"], "e": null, "f": true, "g": [{"h": "é\"q"}]}`
	if got != want || !json.Valid([]byte(got)) {
		t.Errorf("pyJSON = %s", got)
	}
}

// An Effect changes only what it says: the same task and first user turn,
// fixed deficits gone, broken ones planted, routing recorded.
func TestRolloutWithEffect(t *testing.T) {
	g := New(Config{Seed: 7})
	fixedSome, brokeSome := false, false
	for i := range 400 {
		base := g.Rollout(i)
		p := g.Plan(i)
		if p.Environment != base.Environment || p.AgentVersion != base.Agent.Version || p.TaskID != base.TaskID || p.FirstUser == "" {
			t.Fatalf("plan %d = %+v", i, p)
		}
		if same := g.RolloutWith(i, Effect{}); !reflect.DeepEqual(same, base) {
			t.Fatalf("rollout %d: an empty effect changed it", i)
		}
		fixed := g.RolloutWith(i, Effect{Adapter: "pv", DecisionID: "d1", ConversationID: "c1", Fixes: Capabilities})
		if fixed.TaskID != base.TaskID || fixed.Routing == nil || fixed.Routing.Adapter != "pv" || fixed.ConversationID != "c1" {
			t.Fatalf("rollout %d: %+v %+v", i, fixed.Routing, fixed.ConversationID)
		}
		if first := firstUser(fixed); first != p.FirstUser {
			t.Fatalf("rollout %d: the first user turn changed under the effect: %q vs %q", i, first, p.FirstUser)
		}
		sim := fixed.Metadata["sim"].(map[string]any)
		if n := len(sim["planted"].([]string)); n != 0 {
			t.Fatalf("rollout %d: every deficit fixed, %d planted", i, n)
		}
		if len(base.Metadata["sim"].(map[string]any)["planted"].([]string)) > 0 {
			fixedSome = true
		}
		broke := g.RolloutWith(i, Effect{Adapter: "bad", Breaks: map[string]float64{ToolErrorRecovery: 1}})
		bs := broke.Metadata["sim"].(map[string]any)
		if slices.Contains(bs["needed"].([]string), ToolErrorRecovery) {
			if !slices.Contains(bs["drawn"].([]string), ToolErrorRecovery) {
				t.Fatalf("rollout %d: tool_error_recovery needed and broken, not drawn", i)
			}
			brokeSome = true
		}
	}
	if !fixedSome || !brokeSome {
		t.Fatalf("the sample never exercised the effect: fixed %v broke %v", fixedSome, brokeSome)
	}
}

func firstUser(r *schemas.Rollout) string {
	for _, m := range r.Messages {
		if m.Role == "user" {
			return m.Content
		}
	}
	return ""
}
