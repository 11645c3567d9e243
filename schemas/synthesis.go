package schemas

import (
	json "github.com/go-json-experiment/json"
	"time"
)

// SelectedCapability is the selection record of one capability, with exactly
// the field names of the TRACE release's selected_capabilities.json.
type SelectedCapability struct {
	Skill              string   `json:"skill"`
	Description        string   `json:"description"`
	MeanCov            float64  `json:"mean_cov"`
	StdCov             float64  `json:"std_cov"`
	MeanDelta          float64  `json:"mean_delta"`
	StdDelta           float64  `json:"std_delta"`
	NRunsPassed        int      `json:"n_runs_passed"`
	NRunsTotal         int      `json:"n_runs_total"`
	PassesConsistency  bool     `json:"passes_consistency"`
	ExampleFailedCases []string `json:"example_failed_cases"`
	Status             string   `json:"status"`
}

// Window bounds the rollouts a decision was made on.
type Window struct {
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Rollouts int       `json:"rollouts"`
	Failures int       `json:"failures"`
}

// SynthesisRequest asks the synthesizer to build a training environment for
// one selected capability (schema synthesis_request/v1).
type SynthesisRequest struct {
	Schema                  string             `json:"schema,omitempty"`
	TriggerID               string             `json:"trigger_id"`
	Environment             string             `json:"environment"`
	AgentVersion            string             `json:"agent_version"`
	DictionaryVersion       uint32             `json:"dictionary_version"`
	Epoch                   uint32             `json:"epoch"`
	Capability              SelectedCapability `json:"capability"`
	Rank                    int                `json:"rank,omitempty"`
	Window                  Window             `json:"window"`
	ExampleFailedRolloutIDs []string           `json:"example_failed_rollout_ids,omitempty"`
	Tools                   []Tool             `json:"tools,omitempty"`
	FiredAt                 time.Time          `json:"fired_at"`
}

// DecodeSynthesisRequest decodes and validates a synthesis request.
func DecodeSynthesisRequest(data []byte) (*SynthesisRequest, error) {
	doc, err := decodeDoc(data, DecodeOptions{})
	if err != nil {
		return nil, err
	}
	if err := Validate(KindSynthesisRequest, doc); err != nil {
		return nil, err
	}
	var s SynthesisRequest
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, &Error{Reason: ReasonSchema, Msg: err.Error()}
	}
	return &s, nil
}
