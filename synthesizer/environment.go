package synthesizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/traceops/trace/schemas"
)

// Environment is the record of one environment's synthesis: what the
// environments table stores, the dashboard shows and `trace env show`
// prints. There is one per synthesis request, whatever is redelivered: its
// ID is schemas.EnvironmentID(trigger id).
type Environment struct {
	ID                string                    `json:"id"`
	TriggerID         string                    `json:"trigger_id"`
	Environment       string                    `json:"environment"`
	AgentVersion      string                    `json:"agent_version"`
	DictionaryVersion uint32                    `json:"dictionary_version"`
	Capability        string                    `json:"capability"`
	Definition        string                    `json:"definition"`
	Rank              int                       `json:"rank,omitempty"`
	MeanDelta         float64                   `json:"mean_delta"`
	Family            string                    `json:"family,omitempty"`
	FamilySource      string                    `json:"family_source,omitempty"` // FamilyFromDictionary | FamilyMatched
	FamilyWhy         string                    `json:"family_why,omitempty"`    // how the family was found, or why none
	Request           *schemas.SynthesisRequest `json:"request"`

	Status    Status   `json:"status"`
	Path      Path     `json:"path,omitempty"`
	Attempt   int      `json:"attempt"` // the machine's current attempt
	Reason    string   `json:"reason,omitempty"`
	Diagnoses []string `json:"diagnoses,omitempty"`
	// TransientFailures counts the deliveries of the request that ended in
	// a transient failure (the worker's MaxDeliver bounds them); a request
	// handed back at shutdown or redelivered after a crash is not one.
	TransientFailures int `json:"transient_failures,omitempty"`

	// The accepted program (DONE) or the last one written.
	Program     string   `json:"program,omitempty"`
	ProgramHash string   `json:"program_hash,omitempty"`
	Tools       []string `json:"tools,omitempty"`
	Rationale   string   `json:"rationale,omitempty"`

	Attempts    []Attempt    `json:"attempts"`
	Calibration *Calibration `json:"calibration,omitempty"` // of the accepted program
	// Progress is the running calibration's progress while the status is
	// CALIBRATING (saved at most every Config.ProgressEvery), afterwards
	// the last calibration's as it ended; nil before the first.
	Progress *CalibrationProgress `json:"calibration_progress,omitempty"`

	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Version orders the stored rows of one environment (ReplacingMergeTree
	// keeps the highest): every save writes a higher one.
	Version uint64 `json:"version"`
}

// CalibrationProgress is how far a calibration got: Done of Total
// rollouts played (Total is 0 until the first rollout ends), counted at At.
type CalibrationProgress struct {
	Path      Path      `json:"path,omitempty"`
	Attempt   int       `json:"attempt"`
	Done      int       `json:"done"`
	Total     int       `json:"total"`
	StartedAt time.Time `json:"started_at"`
	At        time.Time `json:"at"`
}

// Percent is Done as a whole percentage of Total (0 when Total is 0).
func (p *CalibrationProgress) Percent() int {
	if p == nil || p.Total <= 0 {
		return 0
	}
	return 100 * p.Done / p.Total
}

// Text is "400/1600 (25 %)", "" when no rollout has been counted.
func (p *CalibrationProgress) Text() string {
	if p == nil || p.Total <= 0 {
		return ""
	}
	return fmt.Sprintf("%d/%d (%d %%)", p.Done, p.Total, p.Percent())
}

// CalibratingProgress is the progress of the calibration the record says
// is running, nil unless the status is CALIBRATING and a save counted a
// rollout of it.
func (e *Environment) CalibratingProgress() *CalibrationProgress {
	p := e.Progress
	if e.Status != StatusCalibrating || p == nil || p.Total <= 0 || p.Attempt != e.Attempt || p.Path != e.Path {
		return nil
	}
	return p
}

// StatusText is the status with a running calibration's progress:
// "CALIBRATING 400/1600 (25 %)".
func (e *Environment) StatusText() string {
	if p := e.CalibratingProgress(); p != nil {
		return string(e.Status) + " " + p.Text()
	}
	return string(e.Status)
}

// Where an environment's family came from.
const (
	FamilyFromDictionary = "dictionary" // the dictionary's family: field
	FamilyMatched        = "matched"    // templates matched the name and definition
)

// Machine is the state machine's view of the record.
func (e *Environment) Machine(maxAttempts int) Machine {
	return Machine{Status: e.Status, Path: e.Path, Attempt: e.Attempt, MaxAttempts: maxAttempts, Reason: e.Reason, Diagnoses: e.Diagnoses}
}

func (e *Environment) setMachine(m Machine) {
	e.Status, e.Path, e.Attempt, e.Reason, e.Diagnoses = m.Status, m.Path, m.Attempt, m.Reason, m.Diagnoses
}

// Accepted is the accepted attempt, nil when there is none.
func (e *Environment) Accepted() *Attempt {
	for i := range e.Attempts {
		if e.Attempts[i].Accepted {
			return &e.Attempts[i]
		}
	}
	return nil
}

// PassAtK is the accepted calibration's pass@k, nil before.
func (e *Environment) PassAtK() map[string]float64 {
	if e.Calibration == nil {
		return nil
	}
	return e.Calibration.PassAtK
}

// Stages of an attempt.
const (
	StageGenerate  = "generate"
	StageValidate  = "validate"
	StageCalibrate = "calibrate"
)

// Attempt is one program written for an environment and what became of it.
type Attempt struct {
	N      int             `json:"n"`
	Origin string          `json:"origin"` // schemas.OriginLLM | schemas.OriginTemplate
	Family string          `json:"family,omitempty"`
	Model  string          `json:"model,omitempty"`
	Knobs  json.RawMessage `json:"knobs,omitempty"` // a template's difficulty knobs
	// Program is the attempt's program text; ProgramHash its sha256.
	Program     string `json:"program,omitempty"`
	ProgramHash string `json:"program_hash,omitempty"`
	// Stage is where the attempt ended; Accepted is true for the program
	// that was accepted. Diagnosis is what was wrong, fed to the next one.
	Stage       string       `json:"stage"`
	Accepted    bool         `json:"accepted"`
	Diagnosis   string       `json:"diagnosis,omitempty"`
	Validation  *Validation  `json:"validation,omitempty"`
	Calibration *Calibration `json:"calibration,omitempty"`
	LLM         *LLMUsage    `json:"llm,omitempty"`
	StartedAt   time.Time    `json:"started_at"`
	EndedAt     time.Time    `json:"ended_at"`
}

// LLMUsage is what the generation call of an attempt cost.
type LLMUsage struct {
	Calls            int    `json:"calls"` // HTTP attempts of the call (retries included)
	PromptTokens     int    `json:"prompt_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	FinishReason     string `json:"finish_reason,omitempty"`
}

// Validation is the verdict of the validation checks on one program.
type Validation struct {
	OK     bool    `json:"ok"`
	Checks []Check `json:"checks"`
	// What the program declared, when it loaded.
	Tools        []string `json:"tools,omitempty"`
	Rationale    string   `json:"rationale,omitempty"`
	HasHint      bool     `json:"has_hint"`
	HasReference bool     `json:"has_reference"`
}

// Check is one validation check's verdict (envprog.Check): Verdict is
// "pass", "fail" or "skip"; Message names the check, the seed and the value
// when it failed.
type Check struct {
	Name    string `json:"name"`
	Verdict string `json:"verdict"`
	Message string `json:"message,omitempty"`
}

// Check verdicts.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip"
)

// Diagnosis is every failed check's message, one per line.
func (v *Validation) Diagnosis() string {
	var out []string
	for _, c := range v.Checks {
		if c.Verdict == Fail {
			msg := c.Message
			if msg == "" {
				msg = "failed"
			}
			if !strings.HasPrefix(msg, c.Name) {
				msg = c.Name + ": " + msg
			}
			out = append(out, msg)
		}
	}
	if len(out) == 0 && !v.OK {
		return "validation failed"
	}
	return strings.Join(out, "\n")
}

// Calibration is a calibration run's summary and verdict.
type Calibration struct {
	Accepted bool `json:"accepted"`
	// Verdict is "accepted", "too_easy", "too_hard" or another short code of
	// the calibration's judgement; Diagnosis explains it for the repair loop.
	Verdict   string `json:"verdict"`
	Diagnosis string `json:"diagnosis,omitempty"`
	// Policy names the model that played; Simulated marks the simulated policy.
	Policy            string             `json:"policy"`
	Simulated         bool               `json:"simulated"`
	Seeds             int                `json:"seeds"`
	RolloutsPerSeed   int                `json:"rollouts_per_seed"`
	Temperature       float64            `json:"temperature"`
	MeanReward        float64            `json:"mean_reward"`
	StdReward         float64            `json:"std_reward"`
	SuccessRate       float64            `json:"success_rate"`
	AllSuccessGroups  float64            `json:"all_success_groups"`
	AllZeroGroups     float64            `json:"all_zero_groups"`
	ConstantGroups    float64            `json:"constant_groups"`
	InformativeGroups float64            `json:"informative_groups"`
	PassAtK           map[string]float64 `json:"pass_at_k,omitempty"`
	// Histogram counts rollouts by reward in HistogramBins equal bins over
	// [0, 1] (the last bin includes 1.0).
	Histogram []int `json:"histogram,omitempty"`
	// Errors counts rollouts that ended in an error of the program or the policy.
	Errors int `json:"errors,omitempty"`
}

// HistogramBins is the number of reward bins of Calibration.Histogram.
const HistogramBins = 10

// PassAtKeys returns the ks of PassAtK in ascending order.
func (c *Calibration) PassAtKeys() []string {
	ks := make([]string, 0, len(c.PassAtK))
	for k := range c.PassAtK {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if len(ks[i]) != len(ks[j]) {
			return len(ks[i]) < len(ks[j])
		}
		return ks[i] < ks[j]
	})
	return ks
}

// ProgramHash is the hex sha256 of a program's text (envprog.Info.Hash).
func ProgramHash(program string) string {
	h := sha256.Sum256([]byte(program))
	return hex.EncodeToString(h[:])
}

// Ready is the environment_ready.v1 message of a DONE environment.
func (e *Environment) Ready(now time.Time) (*schemas.EnvironmentReady, error) {
	last := e.Accepted()
	if e.Status != StatusDone || e.Calibration == nil || last == nil {
		return nil, fmt.Errorf("synthesizer: environment %s is %s, not DONE with an accepted, calibrated attempt", e.ID, e.Status)
	}
	c := e.Calibration
	return &schemas.EnvironmentReady{
		Schema: schemas.EnvironmentReadySchema, EnvironmentID: e.ID, TriggerID: e.TriggerID,
		Environment: e.Environment, AgentVersion: e.AgentVersion, DictionaryVersion: e.DictionaryVersion,
		Capability: schemas.ReadyCapability{Name: e.Capability, Definition: e.Definition, Family: e.Family, MeanDelta: e.MeanDelta, Rank: e.Rank},
		Program: schemas.ReadyProgram{Hash: e.ProgramHash, Origin: last.Origin, Family: last.Family, Model: last.Model,
			Tools: e.Tools, Attempts: e.Attempt, Rationale: e.Rationale},
		Calibration: schemas.ReadyCalib{Policy: c.Policy, Simulated: c.Simulated, Seeds: c.Seeds, RolloutsPerSeed: c.RolloutsPerSeed,
			Temperature: c.Temperature, MeanReward: c.MeanReward, StdReward: c.StdReward, SuccessRate: c.SuccessRate,
			AllSuccessGroups: c.AllSuccessGroups, AllZeroGroups: c.AllZeroGroups, ConstantGroups: c.ConstantGroups,
			InformativeGroups: c.InformativeGroups, PassAtK: c.PassAtK},
		Fetch: schemas.ReadyFetch{Path: schemas.EnvironmentProgramPath(e.ID),
			ClickHouse: schemas.ClickHouseRef{Table: "environments", EnvironmentID: e.ID, ProgramHash: e.ProgramHash}},
		ReadyAt: now.UTC(),
	}, nil
}
