package verify

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/traceops/trace/sink"
)

// ShareSource counts an environment's rollouts per adapter ("" for the
// base model) and time bucket. *sink.Store implements it from
// rollouts.adapter (what the rollouts report of their routing);
// DecisionShares from the router's own decision log.
type ShareSource interface {
	RoutingShare(ctx context.Context, environment string, window, bucket time.Duration) ([]sink.ShareRow, error)
}

// shareName is the name a ShareSource reports as EnvShare.Source
// ("rollouts.adapter" when it has none).
type shareName interface{ ShareName() string }

// tokenSource is a ShareSource that also sums the proxied requests' token
// usage per day and adapter (DecisionShares).
type tokenSource interface {
	TokenUsage(ctx context.Context, environment string, since time.Time) ([]sink.TokenUsageRow, error)
}

// DecisionShares is the ShareSource over the router's decisions
// (route_decisions, sink.Store.DecisionShare), with their token usage
// (sink.Store.TokenUsage).
type DecisionShares struct {
	Store interface {
		DecisionShare(ctx context.Context, environment string, window, bucket time.Duration) ([]sink.ShareRow, error)
		TokenUsage(ctx context.Context, environment string, since time.Time) ([]sink.TokenUsageRow, error)
	}
}

// TokenUsage is the proxied requests' token usage per day and adapter.
func (d DecisionShares) TokenUsage(ctx context.Context, environment string, since time.Time) ([]sink.TokenUsageRow, error) {
	return d.Store.TokenUsage(ctx, environment, since)
}

// RoutingShare implements ShareSource.
func (d DecisionShares) RoutingShare(ctx context.Context, environment string, window, bucket time.Duration) ([]sink.ShareRow, error) {
	return d.Store.DecisionShare(ctx, environment, window, bucket)
}

// ShareName is "route_decisions".
func (DecisionShares) ShareName() string { return "route_decisions" }

// CapabilityLoop is one capability of one environment: every adapter
// trained for it, with its comparison.
type CapabilityLoop struct {
	Environment string         `json:"environment"`
	Capability  string         `json:"capability"`
	Adapters    []AdapterCheck `json:"adapters"`
}

// EnvShare is the routing share per adapter over time in one environment:
// Share[adapter][i] is the adapter's share of Totals[i], the decisions or
// rollouts (Source: route_decisions or rollouts.adapter) of the bucket
// starting at Buckets[i]. The base model is "".
type EnvShare struct {
	Environment string               `json:"environment"`
	Bucket      string               `json:"bucket"`
	Buckets     []time.Time          `json:"buckets"`
	Totals      []uint64             `json:"totals"`
	Share       map[string][]float64 `json:"share"`
	Source      string               `json:"source"`
}

// EnvTokens is the token usage of one environment's proxied requests per
// day and adapter, from the first bucket of its routing share on; an
// environment whose upstream reported no usage has none.
type EnvTokens struct {
	Environment string               `json:"environment"`
	Days        []sink.TokenUsageRow `json:"days"`
}

// Report is the closed loop per capability, the routing share, and the
// token usage where the share is the router's decisions.
type Report struct {
	Config       Config           `json:"config"`
	Capabilities []CapabilityLoop `json:"capabilities"`
	Share        []EnvShare       `json:"routing_share"`
	Tokens       []EnvTokens      `json:"tokens"`
	// Errors are the parts that could not be read (an adapter's check, an
	// environment's routing share or tokens); the rest of the report stands.
	Errors []string `json:"errors,omitempty"`
}

// ReportStatuses are the adapter statuses a report covers: the ones in
// service and the ones the guard (or an operator) took out, so a rollback
// stays visible with the evidence.
var ReportStatuses = []string{"active", "rolled_back", "retired"}

// Report checks every adapter with one of ReportStatuses and reads the
// routing share of their environments over the window back from each
// one's newest rollout (0: all), from the first of the share sources that
// has rows for the environment (none: no share), and, when that source
// counts tokens (DecisionShares), the token usage over the share's range.
// An adapter whose check fails, or an environment whose share or tokens
// cannot be read, is left out with its error in Report.Errors; the error
// is returned only when nothing could be checked.
func (c *Checker) Report(ctx context.Context, window, bucket time.Duration, shares ...ShareSource) (*Report, error) {
	checks, err := c.Check(ctx, ReportStatuses...)
	if err != nil && len(checks) == 0 {
		return nil, err
	}
	// Empty lists, not null, in JSON: every endpoint's and command's way.
	rep := &Report{Config: c.cfg, Errors: errorLines(err), Capabilities: []CapabilityLoop{}, Share: []EnvShare{}, Tokens: []EnvTokens{}}
	idx := map[[2]string]int{}
	var envs []string
	for _, ac := range checks {
		k := [2]string{ac.Environment, ac.Capability}
		i, ok := idx[k]
		if !ok {
			i = len(rep.Capabilities)
			idx[k] = i
			rep.Capabilities = append(rep.Capabilities, CapabilityLoop{Environment: ac.Environment, Capability: ac.Capability})
			if !slices.Contains(envs, ac.Environment) {
				envs = append(envs, ac.Environment)
			}
		}
		rep.Capabilities[i].Adapters = append(rep.Capabilities[i].Adapters, ac)
	}
	sort.Slice(rep.Capabilities, func(i, j int) bool {
		a, b := rep.Capabilities[i], rep.Capabilities[j]
		if a.Environment != b.Environment {
			return a.Environment < b.Environment
		}
		return a.Capability < b.Capability
	})
	sort.Strings(envs)
	for _, env := range envs {
		for _, src := range shares {
			rows, err := src.RoutingShare(ctx, env, window, bucket)
			if err != nil {
				rep.Errors = append(rep.Errors, fmt.Sprintf("routing share of %s: %v", env, err))
				break
			}
			if len(rows) == 0 {
				continue
			}
			name := "rollouts.adapter"
			if n, ok := src.(shareName); ok {
				name = n.ShareName()
			}
			sh := shareSeries(env, bucket, name, rows)
			rep.Share = append(rep.Share, sh)
			if ts, ok := src.(tokenSource); ok && len(sh.Buckets) > 0 {
				days, err := ts.TokenUsage(ctx, env, sh.Buckets[0])
				if err != nil {
					rep.Errors = append(rep.Errors, fmt.Sprintf("token usage of %s: %v", env, err))
				} else if reported(days) {
					rep.Tokens = append(rep.Tokens, EnvTokens{Environment: env, Days: days})
				}
			}
			break
		}
	}
	return rep, nil
}

// reported is whether the upstream reported the usage of any request of
// days (none: the environment's tokens are left out, not shown as zeros).
func reported(days []sink.TokenUsageRow) bool {
	for _, d := range days {
		if d.WithUsage > 0 {
			return true
		}
	}
	return false
}

// errorLines is err's parts (errors.Join's), one line each; nil for nil.
func errorLines(err error) []string {
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

// shareSeries turns bucket counts into shares per adapter.
func shareSeries(env string, bucket time.Duration, source string, rows []sink.ShareRow) EnvShare {
	s := EnvShare{Environment: env, Bucket: bucket.String(), Share: map[string][]float64{}, Source: source}
	pos := map[time.Time]int{}
	for _, r := range rows {
		if _, ok := pos[r.Bucket]; !ok {
			pos[r.Bucket] = len(s.Buckets)
			s.Buckets = append(s.Buckets, r.Bucket)
			s.Totals = append(s.Totals, 0)
		}
		s.Totals[pos[r.Bucket]] += r.Rollouts
	}
	for _, r := range rows {
		xs := s.Share[r.Adapter]
		if xs == nil {
			xs = make([]float64, len(s.Buckets))
			s.Share[r.Adapter] = xs
		}
		i := pos[r.Bucket]
		xs[i] = float64(r.Rollouts) / float64(s.Totals[i])
	}
	return s
}

// Reporter is a read-only closed-loop report source (the dashboard's):
// a Checker without rollback or publisher, and the share sources in order
// of preference.
type Reporter struct {
	Checker *Checker
	Shares  []ShareSource
}

// LoopReport is Checker.Report with the reporter's share sources.
func (r Reporter) LoopReport(ctx context.Context, window, bucket time.Duration) (*Report, error) {
	return r.Checker.Report(ctx, window, bucket, r.Shares...)
}
