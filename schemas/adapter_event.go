package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// AdapterEventSchema is the schema value of an adapter event.
const AdapterEventSchema = "adapter_event/v1"

// Adapter event types.
const (
	AdapterActivated  = "activated"
	AdapterRetired    = "retired"
	AdapterRolledBack = "rolled_back"
)

// AdapterEvent is a transition of an adapter in the registry (schema
// adapter_event/v1), published on trace.adapters.events.
type AdapterEvent struct {
	Schema       string    `json:"schema"`
	EventID      string    `json:"event_id"`
	Type         string    `json:"type"`
	Adapter      string    `json:"adapter"`
	Capability   string    `json:"capability"`
	Environment  string    `json:"environment"`
	AgentVersion string    `json:"agent_version,omitempty"`
	At           time.Time `json:"at"`
	By           string    `json:"by"`
	Reason       string    `json:"reason,omitempty"`
	Simulated    bool      `json:"simulated,omitempty"`
	Evidence     *Evidence `json:"evidence,omitempty"`
}

// Evidence is the closed-loop comparison behind a guard's decision.
type Evidence struct {
	// Level is the confidence level of the intervals; 0 (absent) is 0.95.
	Level          float64   `json:"level,omitempty"`
	Verdict        string    `json:"verdict"`
	Before         Side      `json:"before"`
	After          Side      `json:"after"`
	DeltaChange    *Interval `json:"delta_change,omitempty"`
	PassRateChange *Interval `json:"pass_rate_change,omitempty"`
}

// Side is one side (before activation, routed after it) of the comparison.
type Side struct {
	Rollouts int      `json:"rollouts"`
	Failures int      `json:"failures"`
	Delta    Interval `json:"delta"`
	PassRate Interval `json:"pass_rate"`
}

// Interval is an estimate with its 95 % confidence interval.
type Interval struct {
	Value float64 `json:"value"`
	Lo    float64 `json:"lo"`
	Hi    float64 `json:"hi"`
}

// AdapterEventID is the event id of a transition: "aev-" and the first 16
// hex digits of sha256(adapter, NUL, type, NUL, registry version). The
// same transition published twice has the same id.
func AdapterEventID(adapter, typ string, version uint64) string {
	h := sha256.Sum256([]byte(adapter + "\x00" + typ + "\x00" + strconv.FormatUint(version, 10)))
	return "aev-" + hex.EncodeToString(h[:8])
}

// DecodeAdapterEvent decodes and validates an adapter event strictly.
func DecodeAdapterEvent(data []byte) (*AdapterEvent, error) {
	e, err := decodeStrict[AdapterEvent](data, KindAdapterEvent, DecodeOptions{MaxBytes: 1 << 20})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Encode validates and encodes an event: trace never publishes an invalid
// one.
func (e *AdapterEvent) Encode() ([]byte, error) {
	e.Schema = AdapterEventSchema
	data, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	if _, err := DecodeAdapterEvent(data); err != nil {
		return nil, fmt.Errorf("adapter event %s %s: %w", e.Adapter, e.Type, err)
	}
	return data, nil
}
