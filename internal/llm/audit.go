package llm

import (
	"context"
	"sync"
	"time"
)

// AuditRecord is the audit row of one HTTP attempt to an LLM endpoint. (The
// wiring stores it as sink.LLMCall in llm_calls; the fields are the same.)
type AuditRecord struct {
	TS                             time.Time
	Purpose, Model, Endpoint       string // purpose: label | discover | ...
	PromptHash, RolloutID          string
	Run                            uint16
	Attempt                        uint8
	PromptTokens, CompletionTokens uint32
	LatencyMS                      uint32
	Outcome                        string // one of the Outcome constants
	Error                          string
}

// Outcomes of one HTTP attempt, as recorded in AuditRecord.Outcome.
const (
	OutcomeOK          = "ok"
	OutcomeHTTP429     = "http_429"
	OutcomeHTTP5xx     = "http_5xx"
	OutcomeHTTP4xx     = "http_4xx" // any other non-2xx status; retried only when 408 or 409
	OutcomeTimeout     = "timeout"
	OutcomeNetwork     = "network"
	OutcomeInvalidJSON = "invalid_json" // the answer (or the response envelope) is not JSON
	OutcomeSchema      = "schema"       // JSON, but the schema or the caller's Validate rejected it
	OutcomeCanceled    = "canceled"     // the caller's context ended during the attempt
)

// Recorder receives one audit row per HTTP attempt, after the attempt ends.
//
// RecordLLMCall is called synchronously from the goroutine of the Chat call,
// possibly from many goroutines at once: it must be safe for concurrent use
// and must not block (buffer, then write in batches elsewhere). Its ctx is not
// cancelled when the Chat call's is, so an attempt cut short by the caller is
// still recorded. Rows never contain the API key or the prompt text, only its
// hash.
type Recorder interface {
	RecordLLMCall(ctx context.Context, call AuditRecord)
}

// RecorderFunc adapts a function to Recorder.
type RecorderFunc func(ctx context.Context, call AuditRecord)

// RecordLLMCall calls f.
func (f RecorderFunc) RecordLLMCall(ctx context.Context, call AuditRecord) { f(ctx, call) }

// BufferRecorder collects audit rows in memory until drained. The zero value
// is ready to use and safe for concurrent use.
type BufferRecorder struct {
	mu    sync.Mutex
	calls []AuditRecord
}

// RecordLLMCall appends call.
func (b *BufferRecorder) RecordLLMCall(_ context.Context, call AuditRecord) {
	b.mu.Lock()
	b.calls = append(b.calls, call)
	b.mu.Unlock()
}

// Drain returns the rows recorded since the last Drain, in recording order,
// and forgets them.
func (b *BufferRecorder) Drain() []AuditRecord {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.calls
	b.calls = nil
	return out
}
