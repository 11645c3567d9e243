package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/internal/dev/simupstream"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/verify"
)

// The demo's closed loop (TRACE step 4): after the simulated trainer has
// registered an adapter per ready environment, the demo activates them,
// plants one harmful adapter, sends the simulated fleet's traffic through
// the routing proxy in front of a SIMULATED upstream, and reports each
// planted capability's Δ before and after with its verdict, and the
// guard's rollback of the harmful adapter.

// loopDisclaimer is said wherever the loop's results are shown.
const loopDisclaimer = "SIMULATED: the classifier and the answers are the simulated upstream's (no model ran); " +
	"a conversation routed to an adapter loses that adapter's planted deficit — the simulation's stand-in for a trained adapter, " +
	"since the simulated trainer trained nothing; the harmful adapter is planted by the demo"

// harmfulCapability is the capability the planted harmful adapter breaks:
// one the fleet does not lack, so the guard has a clear before to compare
// with.
const harmfulCapability = simulate.ToolErrorRecovery

// demoLoop is the closed-loop section of the summary.
type demoLoop struct {
	Simulated string            `json:"simulated"`
	Traffic   int               `json:"traffic"`  // conversations sent through the proxy
	Routed    map[string]int    `json:"routed"`   // per adapter ("none": the base model)
	Adapters  []demoLoopAdapter `json:"adapters"` // the planted deficits' adapters and the harmful one
	OK        bool              `json:"ok"`       // every planted gap closed and the harmful adapter rolled back
	// Triggers are the synthesis requests that arrived during the loop:
	// the analyzer may see the harmful adapter's regression as a new gap
	// (its capability, in its cohort) before the guard rolls it back; any
	// other is a problem.
	Triggers  []demoLoopTrigger `json:"triggers,omitempty"`
	Problems  []string          `json:"problems,omitempty"`
	GuardNote string            `json:"guard,omitempty"`
}

type demoLoopAdapter struct {
	Adapter      string          `json:"adapter"`
	Environment  string          `json:"environment"`
	AgentVersion string          `json:"agent_version"`
	Capability   string          `json:"capability"`
	Role         string          `json:"role"` // planted_deficit | harmful
	Status       string          `json:"status"`
	Verdict      verify.Verdict  `json:"verdict"`
	Reason       string          `json:"reason"`
	DeltaBefore  verify.Interval `json:"delta_before"`
	DeltaAfter   verify.Interval `json:"delta_after"`
	PassBefore   verify.Interval `json:"pass_rate_before"`
	PassAfter    verify.Interval `json:"pass_rate_after"`
	Routed       int             `json:"routed_rollouts"`
}

// demoLoopTrigger is a synthesis request of the closed loop, with its
// environment's status when the demo ended.
type demoLoopTrigger struct {
	Environment  string `json:"environment"`
	AgentVersion string `json:"agent_version"`
	Capability   string `json:"capability"`
	Harmful      bool   `json:"harmful_adapter_regression"` // the harmful adapter's capability in its cohort
	EnvID        string `json:"environment_id"`
	EnvStatus    string `json:"environment_status,omitempty"` // "" when not stored yet
	EnvReason    string `json:"environment_reason,omitempty"`
}

// adapterWait bounds the wait for the simulated trainer's adapters.
const adapterWait = 2 * time.Minute

// loopDriver runs the closed loop of one demo.
type loopDriver struct {
	d        *demo
	a        *app.App
	up       *simupstream.Server
	proxyURL string // the routing proxy (the route role)
	gen      *simulate.Generator
	from     int // the first rollout index of the loop's traffic
	traffic  int
	planted  []string // env/agent/capability
	// harmScope is the harmful adapter's cohort (env/agent version).
	harmScope string
}

// activate waits for the simulated trainer's adapters of every planted
// deficit, activates them, and plants the harmful adapter. It returns the
// effect of each adapter name on a conversation routed to it.
func (l *loopDriver) activate(ctx context.Context) (map[string]simulate.Effect, []demoLoopAdapter, error) {
	st := l.a.Store
	want := map[string]bool{}
	for _, p := range l.planted {
		want[p] = true
	}
	found := map[string]sink.AdapterRow{}
	ctx, cancel := context.WithTimeout(ctx, adapterWait)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for len(found) < len(want) {
		rows, err := st.Adapters(ctx, sink.AdapterFilter{})
		if err != nil && ctx.Err() == nil {
			l.d.log.Warn("demo: adapters", "err", err)
		}
		for _, r := range rows {
			k := r.Environment + "/" + r.AgentVersion + "/" + r.Capability
			if want[k] && found[k].Name == "" {
				found[k] = r
				l.d.logf("▣ adapter %s registered for %s (%s)", r.Name, k, r.Status)
			}
		}
		if len(found) == len(want) {
			break
		}
		select {
		case <-ctx.Done():
			var missing []string
			for k := range want {
				if found[k].Name == "" {
					missing = append(missing, k)
				}
			}
			sort.Strings(missing)
			return nil, nil, fmt.Errorf("the simulated trainer registered no adapter for %v within %s of the environments being ready", missing, adapterWait)
		case <-tick.C:
		}
	}
	now := time.Now()
	// The adapter lifecycle's activate transition (trace adapters activate):
	// the simulated adapters have nothing to load, so adapter.serving stays
	// off and the registry records the change.
	reg, err := app.AdapterRegistry(l.d.cfg, st, l.d.log)
	if err != nil {
		return nil, nil, err
	}
	effects := map[string]simulate.Effect{}
	var list []demoLoopAdapter
	for _, k := range l.planted {
		r := found[k]
		if r.Status != "active" {
			if _, err := reg.Activate(ctx, r.Name); err != nil {
				return nil, nil, fmt.Errorf("activate %s: %w", r.Name, err)
			}
		}
		effects[r.Name] = simulate.Effect{Adapter: r.Name, Fixes: []string{r.Capability}}
		list = append(list, demoLoopAdapter{Adapter: r.Name, Environment: r.Environment, AgentVersion: r.AgentVersion, Capability: r.Capability, Role: "planted_deficit"})
		l.d.logf("▣ adapter %s active: conversations routed to it lose the %s deficit (simulated effect)", r.Name, r.Capability)
	}
	// The harmful adapter: on the first planted cohort's environment.
	first := found[l.planted[0]]
	bad := sink.AdapterRow{Name: first.Environment + "-" + harmfulCapability + "-harmful", JobID: "demo-planted", Capability: harmfulCapability,
		Environment: first.Environment, AgentVersion: first.AgentVersion, BaseModel: first.BaseModel, URI: "simulated://harmful",
		Status: "candidate", Simulated: true, CreatedAt: now, UpdatedAt: now, Version: uint64(now.UnixNano()),
		Metadata: `{"trainer":"simulated (no model was trained)","planted":"harmful: conversations routed to it lose tool-error recovery"}`}
	if err := st.SaveAdapter(ctx, bad); err != nil {
		return nil, nil, err
	}
	if _, err := reg.Activate(ctx, bad.Name); err != nil {
		return nil, nil, fmt.Errorf("activate %s: %w", bad.Name, err)
	}
	effects[bad.Name] = simulate.Effect{Adapter: bad.Name, Breaks: map[string]float64{harmfulCapability: 1}}
	l.harmScope = bad.Environment + "/" + bad.AgentVersion
	list = append(list, demoLoopAdapter{Adapter: bad.Name, Environment: bad.Environment, AgentVersion: bad.AgentVersion, Capability: bad.Capability, Role: "harmful"})
	l.d.logf("▣ adapter %s planted and active: HARMFUL — conversations routed to it lose %s (simulated)", bad.Name, harmfulCapability)
	return effects, list, nil
}

// route sends a conversation's first turn through the routing proxy and
// returns the adapter it chose ("" for the base model) and the decision id.
func (l *loopDriver) route(ctx context.Context, client *http.Client, p simulate.Plan, conv string) (string, string, error) {
	body, _ := json.Marshal(map[string]any{"model": "sim-base", "messages": []map[string]string{
		{"role": "system", "content": p.System}, {"role": "user", "content": p.FirstUser}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.proxyURL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Trace-Conversation-Id", conv)
	req.Header.Set("X-Trace-Environment", p.Environment)
	req.Header.Set("X-Trace-Agent-Version", p.AgentVersion)
	resp, err := client.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("routing proxy: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("routing proxy: HTTP %d: %s", resp.StatusCode, cutText(string(raw), 300))
	}
	adapter := resp.Header.Get("X-Trace-Adapter")
	if adapter == "none" {
		adapter = ""
	}
	// The simulated upstream answers as the model the proxy asked it for:
	// the adapter's served name, or the base model.
	if !strings.Contains(string(raw), simupstream.Answer(cmpOr(adapter, "sim-base"))) {
		return "", "", fmt.Errorf("routing proxy: the upstream was not asked for %q: %s", cmpOr(adapter, "sim-base"), cutText(string(raw), 300))
	}
	return adapter, resp.Header.Get("X-Trace-Decision-Id"), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// send routes and publishes the loop's traffic; it returns the number of
// conversations per adapter.
func (l *loopDriver) send(ctx context.Context, effects map[string]simulate.Effect) (map[string]int, error) {
	w := &kafka.Writer{Addr: kafka.TCP(l.a.Brokers...), Topic: l.d.cfg.Kafka.RolloutsTopic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, Compression: kafka.Zstd, BatchSize: 500, BatchTimeout: 10 * time.Millisecond,
		BatchBytes: int64(l.d.cfg.Kafka.WriterBatchBytes()), Transport: l.a.Transport()}
	defer w.Close()
	client := &http.Client{Timeout: 30 * time.Second}
	routed := map[string]int{}
	batch := make([]kafka.Message, 0, 200)
	for i := l.from; i < l.from+l.traffic; i++ {
		p := l.gen.Plan(i)
		l.up.Register(p.Environment, p.FirstUser, p.Needed)
		conv := fmt.Sprintf("conv-%d-%d", l.d.seed, i)
		adapter, decision, err := l.route(ctx, client, p, conv)
		if err != nil {
			return routed, err
		}
		routed[cmpOr(adapter, "none")]++
		eff := effects[adapter] // unknown adapter or base model: no effect
		if eff.Breaks != nil && l.harmScope != p.Environment+"/"+p.AgentVersion {
			// The harm is planted on the harmful adapter's own cohort only:
			// other agent versions the router sends to it are left as they
			// are, so the rest of the fleet's statistics do not move.
			eff.Breaks = nil
		}
		eff.Adapter, eff.DecisionID, eff.ConversationID = adapter, decision, conv
		r := l.gen.RolloutWith(i, eff)
		b, err := json.Marshal(r)
		if err != nil {
			return routed, err
		}
		batch = append(batch, kafka.Message{Key: []byte(r.Key()), Value: b})
		if len(batch) >= 200 || i == l.from+l.traffic-1 {
			if err := w.WriteMessages(ctx, batch...); err != nil {
				return routed, fmt.Errorf("publish routed rollouts: %w", err)
			}
			batch = batch[:0]
		}
	}
	return routed, nil
}

// result checks every adapter after the traffic is labeled and the guard
// had its chance.
func (l *loopDriver) result(ctx context.Context, list []demoLoopAdapter, routed map[string]int) *demoLoop {
	out := &demoLoop{Simulated: loopDisclaimer, Traffic: l.traffic, Routed: routed}
	checks, err := verify.New(l.d.cfg.Verify, l.a.Store, nil, nil, nil).Check(ctx, verify.ReportStatuses...)
	if err != nil {
		out.Problems = append(out.Problems, "closed-loop check: "+err.Error())
	}
	by := map[string]verify.AdapterCheck{}
	for _, c := range checks {
		by[c.Adapter] = c
	}
	for _, a := range list {
		c, ok := by[a.Adapter]
		if !ok {
			out.Problems = append(out.Problems, a.Adapter+": not in the registry's report")
			out.Adapters = append(out.Adapters, a)
			continue
		}
		a.Status, a.Verdict, a.Reason = c.Status, c.Verdict, c.Reason
		a.DeltaBefore, a.DeltaAfter, a.PassBefore, a.PassAfter = c.Before.Delta, c.After.Delta, c.Before.PassRate, c.After.PassRate
		a.Routed = routed[a.Adapter]
		switch a.Role {
		case "planted_deficit":
			if c.Verdict != verify.GapClosed || c.Status != "active" {
				out.Problems = append(out.Problems, fmt.Sprintf("%s (%s/%s/%s): verdict %s, status %s — %s", a.Adapter, a.Environment, a.AgentVersion, a.Capability, c.Verdict, c.Status, c.Reason))
			}
		case "harmful":
			if c.Status != "rolled_back" {
				out.Problems = append(out.Problems, fmt.Sprintf("the harmful adapter %s was not rolled back: status %s, verdict %s — %s", a.Adapter, c.Status, c.Verdict, c.Reason))
			}
		}
		out.Adapters = append(out.Adapters, a)
	}
	out.OK = len(out.Problems) == 0
	return out
}

// waitLoop waits until every rollout published so far is stored and
// labeled, then until the guard rolled the harmful adapter back (or the
// deadline).
func (l *loopDriver) waitLoop(ctx context.Context, total int, harmful string, guardWait time.Duration) string {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		c, err := l.d.counts(ctx, l.a)
		if err == nil && c.Stored >= uint64(total) && c.Labeled >= uint64(total) {
			break
		}
		if err == nil {
			l.d.logf("… closed loop: stored %d/%d  labeled %d/%d", c.Stored, total, c.Labeled, total)
		}
		select {
		case <-ctx.Done():
			return "timed out before the routed rollouts were labeled"
		case <-tick.C:
		}
	}
	deadline := time.After(guardWait)
	for {
		if a, err := l.a.Store.Adapter(ctx, harmful); err == nil && a != nil && a.Status == "rolled_back" {
			var m struct {
				Transitions []struct {
					To, Reason string
				} `json:"transitions"`
			}
			_ = json.Unmarshal([]byte(a.Metadata), &m)
			reason := ""
			for _, t := range m.Transitions {
				if t.To == "rolled_back" {
					reason = t.Reason
				}
			}
			l.d.logf("◆ guard: %s rolled back — %s", harmful, reason)
			return ""
		}
		select {
		case <-ctx.Done():
			return "timed out waiting for the guard"
		case <-deadline:
			return fmt.Sprintf("the guard did not roll %s back within %s", harmful, guardWait)
		case <-tick.C:
		}
	}
}

func printDemoLoop(w io.Writer, l *demoLoop) {
	if l == nil {
		return
	}
	fmt.Fprintf(w, "\nclosed loop (%s):\n", l.Simulated)
	var names []string
	for n := range l.Routed {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, l.Routed[n]))
	}
	fmt.Fprintf(w, "  %d conversations through the routing proxy: %s\n", l.Traffic, strings.Join(parts, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  capability\tcohort\tadapter\trouted\tΔ before\tΔ after\tpass before\tpass after\tverdict\tstatus")
	for _, a := range l.Adapters {
		name := a.Adapter
		if a.Role == "harmful" {
			name += " (HARMFUL, planted)"
		}
		fmt.Fprintf(tw, "  %s\t%s/%s\t%s\t%d\t%s\t%s\t%.3f\t%.3f\t%s\t%s\n", a.Capability, a.Environment, a.AgentVersion, name, a.Routed,
			ci(a.DeltaBefore), ci(a.DeltaAfter), a.PassBefore.Value, a.PassAfter.Value, a.Verdict, a.Status)
	}
	tw.Flush()
	for _, t := range l.Triggers {
		status := cmp.Or(t.EnvStatus, "not stored yet")
		if t.EnvReason != "" {
			status += ": " + cutText(t.EnvReason, 200)
		}
		what := "unexpected"
		if t.Harmful {
			what = "the harmful adapter's regression, seen by the analyzer as a new gap before the guard rolled it back"
		}
		fmt.Fprintf(w, "  synthesis requested during the loop for %s/%s %s (%s); its environment %s: %s\n",
			t.Environment, t.AgentVersion, t.Capability, what, t.EnvID, status)
	}
	for _, p := range l.Problems {
		fmt.Fprintf(w, "  problem: %s\n", p)
	}
}

// closedLoop runs the loop after the environments are DONE and adds its
// section to the summary; the demo is OK only if the loop is.
func (d *demo) closedLoop(ctx context.Context, a *app.App, fleet []simulate.AgentSpec, sum *demoSummary) {
	interval := 10 * time.Millisecond
	l := &loopDriver{d: d, a: a, up: d.upstream, proxyURL: "http://" + a.RouterAddr(), from: d.rollouts, traffic: d.loopN, planted: sum.Planted,
		gen: simulate.New(simulate.Config{Seed: d.seed, Fleet: fleet, Start: time.Now().Add(time.Second - time.Duration(d.rollouts)*interval), Interval: interval})}
	d.logf("\nclosed loop — %s", loopDisclaimer)
	fail := func(problem string) {
		if sum.Loop == nil {
			sum.Loop = &demoLoop{Simulated: loopDisclaimer, Traffic: d.loopN}
		}
		sum.Loop.OK = false
		sum.Loop.Problems = append(sum.Loop.Problems, problem)
		sum.OK = false
		sum.Verdict += "; closed loop: " + problem
	}
	effects, list, err := l.activate(ctx)
	if err != nil {
		fail(err.Error())
		return
	}
	// The router re-reads the registry every router.adapters_refresh.
	select {
	case <-ctx.Done():
	case <-time.After(d.cfg.Router.AdaptersRefresh + 500*time.Millisecond):
	}
	harmful := list[len(list)-1].Adapter
	d.logf("▶ %d simulated conversations → routing proxy %s → simulated upstream", d.loopN, l.proxyURL)
	routed, err := l.send(ctx, effects)
	if err != nil {
		fail(err.Error())
		return
	}
	problem := l.waitLoop(ctx, d.rollouts+d.loopN, harmful, time.Minute)
	sum.Loop = l.result(ctx, list, routed)
	if problem != "" {
		fail(problem)
	}
	h := list[len(list)-1]
	for _, t := range d.loopTriggers(ctx, a, len(sum.Triggers), h.Environment, h.AgentVersion, h.Capability) {
		sum.Loop.Triggers = append(sum.Loop.Triggers, t)
		if !t.Harmful {
			sum.Loop.OK = false
			sum.Loop.Problems = append(sum.Loop.Problems, fmt.Sprintf("a synthesis request for %s/%s %s during the loop, where only the harmful adapter's capability may lose ground", t.Environment, t.AgentVersion, t.Capability))
		}
	}
	if !sum.Loop.OK {
		sum.OK = false
		if problem == "" {
			sum.Verdict += "; closed loop: " + strings.Join(sum.Loop.Problems, "; ")
		}
		return
	}
	sum.Verdict += fmt.Sprintf("; closed loop: the %d planted deficits' gaps closed on routed traffic and the guard rolled the harmful adapter back (simulated upstream and adapter effects)", len(sum.Planted))
}

// loopTriggers are the synthesis requests the watcher saw after the first
// seen (those of step 1), with their environments' status now.
func (d *demo) loopTriggers(ctx context.Context, a *app.App, seen int, harmfulEnv, harmfulAgent, harmfulCap string) []demoLoopTrigger {
	d.mu.Lock()
	later := slices.Clone(d.triggers[min(seen, len(d.triggers)):])
	d.mu.Unlock()
	var out []demoLoopTrigger
	for _, t := range later {
		r := t.Request
		lt := demoLoopTrigger{Environment: r.Environment, AgentVersion: r.AgentVersion, Capability: r.Capability.Skill,
			Harmful: r.Environment == harmfulEnv && r.AgentVersion == harmfulAgent && r.Capability.Skill == harmfulCap,
			EnvID:   schemas.EnvironmentID(r.TriggerID)}
		if e, err := (synthesizer.SinkStore{Rows: a.Store}).LoadEnvironment(ctx, lt.EnvID); err == nil && e != nil {
			lt.EnvStatus, lt.EnvReason = string(e.Status), e.Reason
		}
		out = append(out, lt)
	}
	return out
}
