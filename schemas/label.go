package schemas

import (
	json "github.com/go-json-experiment/json"
	"time"
)

// Label values of one (rollout, capability, run).
const (
	LabelNA      = "NA"      // the task does not need the capability
	LabelPresent = "PRESENT" // needed and exhibited
	LabelLacking = "LACKING" // needed and missing
)

// Label sources.
const (
	SourceRules    = "rules"
	SourceLLM      = "llm"
	SourceExternal = "external"
)

// LabelEvent is one capability label for one rollout in one labeling run
// (schema label/v1). Its identity is (environment, agent_version,
// dictionary_version, capability, run, rollout_id): the statistics take
// exactly one label per identity, whatever is redelivered.
type LabelEvent struct {
	Schema            string    `json:"schema,omitempty"`
	RolloutID         string    `json:"rollout_id"`
	Environment       string    `json:"environment"`
	AgentVersion      string    `json:"agent_version"`
	DictionaryVersion uint32    `json:"dictionary_version"`
	Capability        string    `json:"capability"`
	Run               uint16    `json:"run"`
	Label             string    `json:"label"`
	Success           bool      `json:"success"`
	Reward            float64   `json:"reward"`
	Source            string    `json:"source"`
	TS                time.Time `json:"ts,omitzero"` // the rollout's end time; windows are cut on it
}

// Key is the Kafka partitioning key of a label event (same cohort key as rollouts).
func (l *LabelEvent) Key() string { return l.Environment + "/" + l.AgentVersion }

// DecodeLabel decodes and validates one label event.
func DecodeLabel(data []byte, opt DecodeOptions) (*LabelEvent, error) {
	doc, err := decodeDoc(data, opt)
	if err != nil {
		return nil, err
	}
	if err := Validate(KindLabel, doc); err != nil {
		return nil, err
	}
	var l LabelEvent
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, &Error{Reason: ReasonSchema, Msg: err.Error()}
	}
	return &l, nil
}
