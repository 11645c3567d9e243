package main

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/verify"
)

// loopReport is the closed loop of `trace report` (--loop, and the table's
// last section): every adapter in service or taken out, per capability, the
// routing share per adapter over the last shareWindow of each environment
// (event time, hourly buckets) and the tokens of the proxied requests over
// the share's range.
func loopReport(ctx context.Context, cfg config.Config, st *sink.Store, env string, shareWindow time.Duration) (*verify.Report, error) {
	rep, err := verify.New(cfg.Verify, st, nil, nil, nil).Report(ctx, shareWindow, time.Hour, verify.DecisionShares{Store: st}, st)
	if err != nil {
		return nil, err
	}
	if env != "" {
		rep.Capabilities = slices.DeleteFunc(rep.Capabilities, func(c verify.CapabilityLoop) bool { return c.Environment != env })
		rep.Share = slices.DeleteFunc(rep.Share, func(s verify.EnvShare) bool { return s.Environment != env })
		rep.Tokens = slices.DeleteFunc(rep.Tokens, func(t verify.EnvTokens) bool { return t.Environment != env })
	}
	return rep, nil
}

func ci(i verify.Interval) string { return fmt.Sprintf("%.3f [%.3f, %.3f]", i.Value, i.Lo, i.Hi) }

func writeLoop(w io.Writer, format string, rep *verify.Report) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case "csv":
		cw := csv.NewWriter(w)
		cw.Write([]string{"environment", "capability", "adapter", "status", "simulated", "activated_at", "verdict", "reason", "action",
			"rollouts_before", "rollouts_after", "failures_before", "failures_after",
			"delta_before", "delta_before_lo", "delta_before_hi", "delta_after", "delta_after_lo", "delta_after_hi",
			"pass_rate_before", "pass_rate_before_lo", "pass_rate_before_hi", "pass_rate_after", "pass_rate_after_lo", "pass_rate_after_hi",
			"er_failed_before", "er_failed_after", "er_passed_before", "er_passed_after", "cov_before", "cov_after",
			"agent_version", "dictionary_version", "environment_id", "needed_failures_before", "needed_failures_after",
			"before_from", "before_to", "after_from", "after_to", "before_until", "baseline_adapter"})
		for _, c := range rep.Capabilities {
			for _, a := range c.Adapters {
				b, x := a.Before, a.After
				cw.Write([]string{c.Environment, c.Capability, a.Adapter, a.Status, fmt.Sprint(a.Simulated), a.ActivatedAt.UTC().Format(time.RFC3339),
					string(a.Verdict), a.Reason, a.Action, fmt.Sprint(b.Rollouts), fmt.Sprint(x.Rollouts), fmt.Sprint(b.Failures), fmt.Sprint(x.Failures),
					f4(b.Delta.Value), f4(b.Delta.Lo), f4(b.Delta.Hi), f4(x.Delta.Value), f4(x.Delta.Lo), f4(x.Delta.Hi),
					f4(b.PassRate.Value), f4(b.PassRate.Lo), f4(b.PassRate.Hi), f4(x.PassRate.Value), f4(x.PassRate.Lo), f4(x.PassRate.Hi),
					f4(b.ERFailed.Value), f4(x.ERFailed.Value), f4(b.ERPassed.Value), f4(x.ERPassed.Value), f4(b.Cov.Value), f4(x.Cov.Value),
					a.AgentVersion, fmt.Sprint(a.DictionaryVersion), a.EnvironmentID, fmt.Sprint(b.NeededFailures), fmt.Sprint(x.NeededFailures),
					rfc3339(b.From), rfc3339(b.To), rfc3339(x.From), rfc3339(x.To), rfc3339(a.BeforeUntil), a.BaselineAdapter})
			}
		}
		cw.Flush()
		return cw.Error()
	}
	for _, e := range rep.Errors {
		fmt.Fprintln(w, "closed loop: left out, could not be read:", e)
	}
	if len(rep.Capabilities) == 0 {
		fmt.Fprintln(w, "closed loop: no adapter activated yet")
		return nil
	}
	guard := fmt.Sprintf("on: an adapter is rolled back when one of its %d looks is worse at %s %%, or after them a watch block; see guard: under it", rep.Config.GuardLooks, verify.Pct(rep.Config.GuardLevel()))
	if !rep.Config.Guard {
		guard = "off (verify.guard): worse adapters are only reported"
	}
	fmt.Fprintf(w, "closed loop (before = the base model's rollouts of the cohort before the capability's first adapter was activated, after = the rollouts routed to the adapter;\n"+
		"95 %% intervals in brackets; gap closed = Δ after and its interval < δ %.2f; at least %d labeled failures that need the capability a side; guard %s):\n",
		rep.Config.Delta, rep.Config.MinFailures, guard)
	for _, c := range rep.Capabilities {
		fmt.Fprintf(w, "\n%s on %s\n", c.Capability, c.Environment)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  adapter\tstatus\t\trollouts\tfailures\tΔ\tpass rate\tER-\tER+\tCov\tverdict")
		for _, a := range c.Adapters {
			name := a.Adapter
			if a.Simulated {
				name += " [SIMULATED trainer]"
			}
			for i, s := range []verify.Stats{a.Before, a.After} {
				side, n, st, v := "before", name, a.Status, ""
				if i == 1 {
					side, n, st, v = "after", "", "", string(a.Verdict)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%s\t%s\t%.3f\t%.3f\t%.3f\t%s\n", n, st, side, s.Rollouts, s.Failures, ci(s.Delta), ci(s.PassRate),
					s.ERFailed.Value, s.ERPassed.Value, s.Cov.Value, v)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, a := range c.Adapters {
			line := fmt.Sprintf("  %s: %s — %s", a.Adapter, a.Verdict, a.Reason)
			if a.Action != "" {
				line += " [" + a.Action + "]"
			}
			fmt.Fprintln(w, line)
			note := a.BeforeNote(rfc3339)
			if note != "" {
				note = " (" + note + ")"
			}
			fmt.Fprintf(w, "    cohort %s/%s, dictionary v%d, trained on %s; activated %s; before%s: %s; after: %s\n", a.Environment, a.AgentVersion,
				a.DictionaryVersion, cmp.Or(a.EnvironmentID, "(no environment recorded)"), a.ActivatedAt.UTC().Format(time.RFC3339),
				note, sampleSpan(a.Before), sampleSpan(a.After))
			if a.Status == "active" {
				fmt.Fprintf(w, "    guard: %s\n", a.Guard.Summary())
			}
		}
	}
	for _, s := range rep.Share {
		if len(s.Buckets) == 0 {
			continue
		}
		names := make([]string, 0, len(s.Share))
		for n := range s.Share {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(w, "\nrouting share in %s per hour (from %s):\n", s.Environment, s.Source)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := []string{"  hour", map[bool]string{true: "decisions", false: "rollouts"}[s.Source == "route_decisions"]}
		for _, n := range names {
			head = append(head, cmpName(n))
		}
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		from := max(0, len(s.Buckets)-24) // the last 24 buckets
		for i := from; i < len(s.Buckets); i++ {
			row := []string{"  " + s.Buckets[i].UTC().Format("2006-01-02 15:04"), fmt.Sprint(s.Totals[i])}
			for _, n := range names {
				row = append(row, fmt.Sprintf("%.1f%%", s.Share[n][i]*100))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, et := range rep.Tokens {
		if len(et.Days) == 0 {
			continue
		}
		fmt.Fprintf(w, "\ntokens in %s per day (the upstream's usage of proxied requests, route_decisions):\n", et.Environment)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  day\tadapter\trequests\twith usage\tprompt\tcompletion")
		for _, d := range et.Days {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%d\n", d.Day.Format(time.DateOnly), cmpName(d.Adapter), d.Requests, d.WithUsage, d.PromptTokens, d.CompletionTokens)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func cmpName(adapter string) string {
	if adapter == "" {
		return "base model"
	}
	return adapter
}

// loopShareWindow is the routing share's window: --window's duration, all
// for "all", else the last 7 days of each environment.
func loopShareWindow(window string) time.Duration {
	if window == "all" {
		return 0
	}
	if d, err := config.ParseDuration(window); err == nil && d > 0 {
		return d
	}
	return 7 * 24 * time.Hour
}

// onlyAdapter narrows rep to the adapter named (its capability, the routing
// share and tokens of its environment) and returns its check. An adapter
// the closed loop does not show, or whose check could not be read, is an
// error: it has no verdict.
func onlyAdapter(rep *verify.Report, name string) (verify.AdapterCheck, error) {
	for _, c := range rep.Capabilities {
		for _, a := range c.Adapters {
			if a.Adapter != name {
				continue
			}
			c.Adapters = []verify.AdapterCheck{a}
			rep.Capabilities = []verify.CapabilityLoop{c}
			rep.Share = slices.DeleteFunc(rep.Share, func(s verify.EnvShare) bool { return s.Environment != c.Environment })
			rep.Tokens = slices.DeleteFunc(rep.Tokens, func(t verify.EnvTokens) bool { return t.Environment != c.Environment })
			rep.Errors = slices.DeleteFunc(rep.Errors, func(e string) bool { return !strings.Contains(e, "of "+c.Environment+":") })
			return a, nil
		}
	}
	for _, e := range rep.Errors {
		if strings.HasPrefix(e, "adapter "+name+": ") {
			return verify.AdapterCheck{}, fmt.Errorf("closed loop: %s", e)
		}
	}
	return verify.AdapterCheck{}, fmt.Errorf("--adapter %q: not in the closed loop (only adapters that were activated are; see trace adapters list)", name)
}

// verdictExit is the exit of `trace report --loop --adapter`: nil for
// gap_closed, code 2 for a gap not closed (improved, no_change, worse), 3
// for not_enough_data.
func verdictExit(ac verify.AdapterCheck) error {
	switch ac.Verdict {
	case verify.GapClosed:
		return nil
	case verify.NotEnoughData:
		return &exitError{code: 3, err: fmt.Errorf("adapter %s: undecided: %s: %s", ac.Adapter, ac.Verdict, ac.Reason)}
	}
	return &exitError{code: 2, err: fmt.Errorf("adapter %s: gap not closed: %s: %s", ac.Adapter, ac.Verdict, ac.Reason)}
}

// rfc3339 is t in RFC 3339, UTC; "" for the zero time.
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// sampleSpan says what one side of a comparison rests on: its rollouts,
// the failures among them that need the capability, and their end times.
func sampleSpan(s verify.Stats) string {
	if s.Rollouts == 0 {
		return "no labeled rollouts"
	}
	return fmt.Sprintf("%d rollouts (%d failures needing the capability) %s", s.Rollouts, s.NeededFailures, s.Span(rfc3339))
}
