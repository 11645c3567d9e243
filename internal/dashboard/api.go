package dashboard

import (
	"encoding/json"
	"time"

	"github.com/traceops/trace/sink"
)

// The JSON shapes of /api/*. The HTML pages render the same structs.

// ThresholdsJSON are the selection rule's parameters.
type ThresholdsJSON struct {
	Rho   float64 `json:"rho"`
	Delta float64 `json:"delta"`
	// K and N are analyzer.k and analyzer.n when set (they apply to every
	// cohort); absent, each cohort's follow its labels' source, and its
	// decision says which (Decision.K, Decision.N).
	K           int     `json:"k,omitempty"`
	N           int     `json:"n,omitempty"`
	MinFailures int     `json:"min_failures"`
	WindowHours float64 `json:"window_hours"`
	// WindowRollouts > 0 limits the decision window to the most recent rollouts.
	WindowRollouts int `json:"window_rollouts,omitempty"`
}

// CohortKey names a cohort.
type CohortKey struct {
	Environment       string `json:"environment"`
	AgentVersion      string `json:"agent_version"`
	DictionaryVersion uint32 `json:"dictionary_version"`
}

func (k CohortKey) cohort() sink.Cohort {
	return sink.Cohort{Environment: k.Environment, AgentVersion: k.AgentVersion, DictionaryVersion: k.DictionaryVersion}
}

// CohortSummary is one row of the cohort list: an (environment, agent
// version) with rollouts, per dictionary version it was labeled against
// (DictionaryVersion 0 = rollouts not labeled yet).
type CohortSummary struct {
	CohortKey
	Rollouts        uint64    `json:"rollouts"`
	Successes       uint64    `json:"successes"`
	PassRate        float64   `json:"pass_rate"`
	LabeledRollouts uint64    `json:"labeled_rollouts"`
	Capabilities    uint64    `json:"capabilities"`
	Runs            uint64    `json:"runs"`
	LastSeen        time.Time `json:"last_seen"`
	Selected        int       `json:"selected"` // capabilities selected by the cohort's decision (as in its decision table); 0 without labels
	// Dictionary is the scope of the dictionary that labels the cohort
	// ("*/*" for the default, "env/*", "env/version"); DefaultDictionary
	// says it is the default (no dictionary of its own).
	Dictionary        string `json:"dictionary,omitempty"`
	DefaultDictionary bool   `json:"default_dictionary,omitempty"`
	// NoLabels says why a cohort with rollouts has no labels, naming the
	// setting to change (DictionaryVersion 0 only).
	NoLabels string `json:"no_labels,omitempty"`
}

// Range is the time range of a chart. It ends at AsOf, the watermark of
// what is shown (the start of the newest hour with rollouts or labels: the
// rollup's grain; a decision's as_of is its newest rollout's end time), not
// at the wall clock, so
// replayed history is shown as it happened. Hours 0 with All is every
// rollout. Warning is set when the watermark is in the future (clock skew):
// such data is shown, not hidden.
type Range struct {
	Since   time.Time `json:"since"`
	Until   time.Time `json:"until"`
	AsOf    time.Time `json:"as_of"`
	All     bool      `json:"all,omitempty"`
	Warning string    `json:"warning,omitempty"`
	Hours   int       `json:"hours"`
	// Bucket is the width of a time bucket: "hour" or "day".
	Bucket string `json:"bucket"`
}

// PassPoint is one time bucket of a pass-rate series.
type PassPoint struct {
	Bucket    time.Time `json:"bucket"`
	Rollouts  uint64    `json:"rollouts"`
	Successes uint64    `json:"successes"`
	PassRate  float64   `json:"pass_rate"`
}

// PassSeries is the pass rate of one agent version over time.
type PassSeries struct {
	AgentVersion string      `json:"agent_version"`
	Points       []PassPoint `json:"points"`
}

// CapPoint is Cov and Δ of one capability in one hour, averaged over runs.
type CapPoint struct {
	Bucket    time.Time `json:"bucket"`
	MeanCov   float64   `json:"mean_cov"`
	MeanDelta float64   `json:"mean_delta"`
	Runs      uint64    `json:"runs"`
	Failed    uint64    `json:"failed"` // failed rollouts labeled in the bucket (largest over runs)
	Passed    uint64    `json:"passed"`
}

// CapSeries is one capability's hourly statistics.
type CapSeries struct {
	Capability string     `json:"capability"`
	Points     []CapPoint `json:"points"`
}

// TriggerStatus is the newest trigger transition of a capability.
type TriggerStatus struct {
	Event string    `json:"event"`
	Epoch uint32    `json:"epoch"`
	At    time.Time `json:"at"`
}

// CapabilityDecision is the window statistics and decision of a capability.
type CapabilityDecision struct {
	Name       string  `json:"name"`
	Definition string  `json:"definition,omitempty"`
	Rank       int     `json:"rank"` // by mean Δ, 1 = highest
	MeanCov    float64 `json:"mean_cov"`
	StdCov     float64 `json:"std_cov"`
	MeanDelta  float64 `json:"mean_delta"`
	StdDelta   float64 `json:"std_delta"`
	MeanERFail float64 `json:"mean_er_fail"`
	MeanERPass float64 `json:"mean_er_pass"`
	RunsPassed int     `json:"runs_passed"`
	RunsTotal  int     `json:"runs_total"`
	// Selected: passed in at least K runs. Decision adds whether the window
	// is large enough to act: "selected", "not_selected" or "undecided".
	Selected  bool           `json:"selected"`
	Decision  string         `json:"decision"`
	Rejection []string       `json:"rejection,omitempty"`
	Examples  []string       `json:"examples"`
	Trigger   *TriggerStatus `json:"trigger,omitempty"`
}

// Decision values.
const (
	DecisionSelected    = "selected"
	DecisionNotSelected = "not_selected"
	DecisionUndecided   = "undecided"
)

// WindowJSON describes the decision window.
type WindowJSON struct {
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Rollouts int       `json:"rollouts"`
	Failures int       `json:"failures"`
}

// Decision is the capability selection of one cohort.
type Decision struct {
	// Source is "evaluator" (the evaluator's latest evaluation, stored by
	// any analyze replica) or
	// "computed" (computed now from ClickHouse with the same rule: fresh=1,
	// or a cohort the evaluator has not evaluated).
	Source string `json:"source"`
	// EvaluatedAt is when the evaluator computed a stored evaluation.
	EvaluatedAt time.Time  `json:"evaluated_at,omitzero"`
	Window      WindowJSON `json:"window"`
	// AsOf is the cohort's watermark: its decision window ends there.
	AsOf time.Time `json:"as_of"`
	// Decided is false when the window has fewer failures than
	// min_failures or fewer complete runs than n: no trigger acts then.
	Decided bool   `json:"decided"`
	Reason  string `json:"reason,omitempty"`
	Runs    int    `json:"runs"`
	// K and N: a capability is selected when it passes in at least K of
	// N runs, the cohort's (analyzer.k and analyzer.n, or its labels'
	// source's: 1 of 1 for the rules labeler, 8/10 of llm.runs for the llm
	// labeler, 8 of 10 for external labels).
	K            int                  `json:"k"`
	N            int                  `json:"n"`
	Capabilities []CapabilityDecision `json:"capabilities"`
}

// OverviewResponse is /api/overview.
type OverviewResponse struct {
	GeneratedAt time.Time       `json:"generated_at"`
	Thresholds  ThresholdsJSON  `json:"thresholds"`
	Range       Range           `json:"range"`
	Cohorts     []CohortSummary `json:"cohorts"`
	// Cohort is the cohort shown; nil when there is nothing to show.
	Cohort       *CohortKey   `json:"cohort"`
	Empty        bool         `json:"empty"`
	Message      string       `json:"message,omitempty"`
	PassRate     []PassSeries `json:"pass_rate"`
	Capabilities []CapSeries  `json:"capabilities"`
	Decision     *Decision    `json:"decision"`
}

// RunRow is one labeling run of a capability in the decision window.
type RunRow struct {
	Run           int     `json:"run"`
	LackingFailed int     `json:"lacking_failed"`
	PresentFailed int     `json:"present_failed"`
	NAFailed      int     `json:"na_failed"`
	LackingPassed int     `json:"lacking_passed"`
	PresentPassed int     `json:"present_passed"`
	NAPassed      int     `json:"na_passed"`
	ERFail        float64 `json:"er_fail"`
	ERPass        float64 `json:"er_pass"`
	Delta         float64 `json:"delta"`
	Cov           float64 `json:"cov"`
	Passed        bool    `json:"passed"`
}

// DictCapability is a capability as the dictionary defines it.
type DictCapability struct {
	Name       string   `json:"name"`
	Definition string   `json:"definition"`
	Examples   []string `json:"examples,omitempty"`
	Detector   string   `json:"detector,omitempty"`
}

// ExampleRollout is a failed rollout where the capability was LACKING.
type ExampleRollout struct {
	RolloutID   string                `json:"rollout_id"`
	TaskID      string                `json:"task_id"`
	Success     bool                  `json:"success"`
	Reward      float64               `json:"reward"`
	EndTime     time.Time             `json:"end_time"`
	LackingRuns uint64                `json:"lacking_runs"`
	Runs        uint64                `json:"runs"`
	Found       bool                  `json:"found"` // the rollout is stored (labels can arrive without it)
	Messages    []sink.CompactMessage `json:"messages"`
	Grader      json.RawMessage       `json:"grader,omitempty"`
}

// CapabilityResponse is /api/capability.
type CapabilityResponse struct {
	GeneratedAt  time.Time      `json:"generated_at"`
	Thresholds   ThresholdsJSON `json:"thresholds"`
	Cohort       CohortKey      `json:"cohort"`
	Capability   DictCapability `json:"capability"`
	InDictionary bool           `json:"in_dictionary"`
	// Source is where the decision and per-run counts come from, as in
	// Decision.Source ("evaluator" or "computed"; fresh=1 computes).
	Source   string              `json:"source"`
	Window   WindowJSON          `json:"window"`
	Decided  bool                `json:"decided"`
	Reason   string              `json:"reason,omitempty"`
	K        int                 `json:"k"` // the cohort's K of N, as in Decision
	N        int                 `json:"n"`
	Stats    *CapabilityDecision `json:"stats"` // nil: no labels for it in the window
	PerRun   []RunRow            `json:"per_run"`
	Series   []CapPoint          `json:"series"`
	Range    Range               `json:"range"`
	Triggers []TriggerEvent      `json:"triggers"`
	Examples []ExampleRollout    `json:"examples"`
	Message  string              `json:"message,omitempty"`
}

// TriggerEvent is one trigger transition.
type TriggerEvent struct {
	TriggerID         string          `json:"trigger_id"`
	Environment       string          `json:"environment"`
	AgentVersion      string          `json:"agent_version"`
	DictionaryVersion uint32          `json:"dictionary_version"`
	Capability        string          `json:"capability"`
	Epoch             uint32          `json:"epoch"`
	Event             string          `json:"event"`
	At                time.Time       `json:"at"`
	MeanCov           float64         `json:"mean_cov"`
	MeanDelta         float64         `json:"mean_delta"`
	RunsPassed        uint16          `json:"runs_passed"`
	RunsTotal         uint16          `json:"runs_total"`
	Window            WindowJSON      `json:"window"`
	Payload           json.RawMessage `json:"payload"` // the synthesis request (fired), else null
}

// TriggersResponse is /api/triggers.
type TriggersResponse struct {
	GeneratedAt time.Time      `json:"generated_at"`
	Since       time.Time      `json:"since"`
	Filter      TriggerFilter  `json:"filter"`
	Events      []TriggerEvent `json:"events"`
	Counts      map[string]int `json:"counts"` // per event kind, of every event the filter matches
	Total       int            `json:"total"`  // their sum; Events are the newest of them
	Truncated   bool           `json:"truncated"`
	Message     string         `json:"message,omitempty"`
}

// TriggerFilter narrows /api/triggers ("" = any).
type TriggerFilter struct {
	Environment  string `json:"environment"`
	AgentVersion string `json:"agent_version"`
	Capability   string `json:"capability"`
}

// WeeklyPass is one week of one agent version.
type WeeklyPass struct {
	Week         time.Time `json:"week"` // Monday
	AgentVersion string    `json:"agent_version"`
	Rollouts     uint64    `json:"rollouts"`
	Successes    uint64    `json:"successes"`
	PassRate     float64   `json:"pass_rate"`
}

// CapWeek is one capability's LACKING statistics in one week.
type CapWeek struct {
	Capability    string  `json:"capability"`
	MeanCov       float64 `json:"mean_cov"`
	MeanDelta     float64 `json:"mean_delta"`
	LackingFailed float64 `json:"lacking_failed"` // failures labeled LACKING, mean over runs
	Failed        uint64  `json:"failed"`
}

// WeeklyLacking is the top LACKING capabilities of one agent version in one week.
type WeeklyLacking struct {
	Week         time.Time `json:"week"`
	AgentVersion string    `json:"agent_version"`
	Top          []CapWeek `json:"top"`
}

// WeekOverWeek compares one capability this week with last week.
type WeekOverWeek struct {
	AgentVersion    string  `json:"agent_version"`
	Capability      string  `json:"capability"`
	CovThisWeek     float64 `json:"cov_this_week"`
	CovLastWeek     float64 `json:"cov_last_week"`
	DeltaThisWeek   float64 `json:"delta_this_week"`
	DeltaLastWeek   float64 `json:"delta_last_week"`
	LackingThisWeek float64 `json:"lacking_this_week"`
	LackingLastWeek float64 `json:"lacking_last_week"`
	RunsThisWeek    uint64  `json:"runs_this_week"`
	RunsLastWeek    uint64  `json:"runs_last_week"`
}

// TrendsResponse is /api/trends.
type TrendsResponse struct {
	GeneratedAt   time.Time       `json:"generated_at"`
	Environment   string          `json:"environment"`
	Environments  []string        `json:"environments"`
	Since         time.Time       `json:"since"`
	ThisWeek      time.Time       `json:"this_week"`
	Weeks         []time.Time     `json:"weeks"`
	AgentVersions []string        `json:"agent_versions"`
	PassRate      []WeeklyPass    `json:"pass_rate"`
	Lacking       []WeeklyLacking `json:"lacking"`
	WeekOverWeek  []WeekOverWeek  `json:"week_over_week"`
	Empty         bool            `json:"empty"`
	Message       string          `json:"message,omitempty"`
}
