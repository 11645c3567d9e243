package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// EnvironmentReadySchema is the value of EnvironmentReady.Schema.
const EnvironmentReadySchema = "environment_ready/v1"

// EnvironmentReady announces a synthesized training environment that passed
// validation and calibration (schema environment_ready/v1, NATS subject
// trace.environments.ready, Msg-Id = EnvironmentID).
type EnvironmentReady struct {
	Schema            string          `json:"schema"`
	EnvironmentID     string          `json:"environment_id"`
	TriggerID         string          `json:"trigger_id"`
	Environment       string          `json:"environment"`
	AgentVersion      string          `json:"agent_version"`
	DictionaryVersion uint32          `json:"dictionary_version"`
	Capability        ReadyCapability `json:"capability"`
	Program           ReadyProgram    `json:"program"`
	Calibration       ReadyCalib      `json:"calibration"`
	Fetch             ReadyFetch      `json:"fetch"`
	ReadyAt           time.Time       `json:"ready_at"`
}

// ReadyCapability is the capability the environment trains.
type ReadyCapability struct {
	Name       string  `json:"name"`
	Definition string  `json:"definition"`
	Family     string  `json:"family,omitempty"`
	MeanDelta  float64 `json:"mean_delta,omitempty"`
	Rank       int     `json:"rank,omitempty"`
}

// Origins of a program.
const (
	OriginLLM      = "llm"
	OriginTemplate = "template"
)

// ReadyProgram identifies the accepted program.
type ReadyProgram struct {
	Hash      string   `json:"hash"`   // sha256 of the program text, hex
	Origin    string   `json:"origin"` // OriginLLM | OriginTemplate
	Family    string   `json:"family,omitempty"`
	Model     string   `json:"model,omitempty"`
	Tools     []string `json:"tools"`
	Attempts  int      `json:"attempts"`
	Rationale string   `json:"rationale,omitempty"`
}

// ReadyCalib is the calibration summary of the accepted program.
type ReadyCalib struct {
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
	PassAtK           map[string]float64 `json:"pass_at_k"`
}

// ReadyFetch says where the program can be fetched.
type ReadyFetch struct {
	// Path is the program's URL path on trace's HTTP server (and the
	// environment server): EnvironmentProgramPath(EnvironmentID).
	Path       string        `json:"path"`
	ClickHouse ClickHouseRef `json:"clickhouse"`
}

// ClickHouseRef names the row that stores the program.
type ClickHouseRef struct {
	Table         string `json:"table"` // "environments"
	EnvironmentID string `json:"environment_id"`
	ProgramHash   string `json:"program_hash"`
}

// EnvironmentID derives the environment id of a synthesis request from its
// trigger id, so a redelivered or duplicated request names the same
// environment: "env-" and the first 16 hex digits of sha256(trigger id).
func EnvironmentID(triggerID string) string {
	h := sha256.Sum256([]byte(triggerID))
	return "env-" + hex.EncodeToString(h[:8])
}

// EnvironmentProgramPath is the URL path of an environment's program text.
func EnvironmentProgramPath(id string) string { return "/api/environments/" + id + "/program" }

// DecodeEnvironmentReady decodes and validates an environment-ready message
// strictly: the schema forbids unknown fields at every level, and the
// ClickHouse reference must name the message's own environment and program.
func DecodeEnvironmentReady(data []byte) (*EnvironmentReady, error) {
	e, err := decodeStrict[EnvironmentReady](data, KindEnvironmentReady, DecodeOptions{})
	if err != nil {
		return nil, err
	}
	if e.Fetch.ClickHouse.EnvironmentID != e.EnvironmentID {
		return nil, &Error{Reason: ReasonSchema, Path: "/fetch/clickhouse/environment_id", Rule: "consistency",
			Msg: fmt.Sprintf("%q is not the message's environment_id %q", e.Fetch.ClickHouse.EnvironmentID, e.EnvironmentID)}
	}
	if e.Fetch.ClickHouse.ProgramHash != e.Program.Hash {
		return nil, &Error{Reason: ReasonSchema, Path: "/fetch/clickhouse/program_hash", Rule: "consistency",
			Msg: fmt.Sprintf("%q is not the program's hash %q", e.Fetch.ClickHouse.ProgramHash, e.Program.Hash)}
	}
	return e, nil
}
