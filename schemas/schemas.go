// Package schemas holds the JSON Schemas of every message trace puts on the
// wire (rollout, label event, synthesis request, environment ready, training
// job, training event, adapter event) and the Go types and validation for
// each of them.
//
// The schema files in this directory are the contract: producers outside trace
// validate against them, and every decoder here validates with them (through
// github.com/santhosh-tekuri/jsonschema) before it trusts a message. A
// validation failure is returned as *Error, whose Reason is a stable code that
// ends up in dead-letter headers and metrics, and whose Path and Rule name the
// JSON location and the schema keyword that were broken.
package schemas

import (
	"bytes"
	"embed"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

//go:embed *.schema.json
var files embed.FS

// Kind names one message schema.
type Kind string

// The message kinds trace validates.
const (
	KindRollout          Kind = "rollout.v1"
	KindLabel            Kind = "label.v1"
	KindSynthesisRequest Kind = "synthesis_request.v1"
	KindEnvironmentReady Kind = "environment_ready.v1"
	KindTrainingJob      Kind = "training_job.v1"
	KindTrainingEvent    Kind = "training_event.v1"
	KindAdapterEvent     Kind = "adapter_event.v1"
)

// Kinds lists every schema, for documentation and tests.
var Kinds = []Kind{KindRollout, KindLabel, KindSynthesisRequest, KindEnvironmentReady, KindTrainingJob, KindTrainingEvent, KindAdapterEvent}

// Reason codes of *Error. They are stable: dashboards and DLQ consumers match on them.
const (
	ReasonTooLarge        = "too_large"
	ReasonInvalidUTF8     = "invalid_utf8"
	ReasonNotJSON         = "not_json"
	ReasonDuplicateKey    = "duplicate_key" // an object repeats a member name; Path names the repeat
	ReasonSchema          = "schema"
	ReasonNonFiniteReward = "non_finite_reward"
	ReasonEmpty           = "empty"
)

// Error is a message that cannot be accepted.
type Error struct {
	Reason string // one of the Reason* codes
	Path   string // JSON pointer of the offending value ("" for the whole message)
	Rule   string // the schema keyword that failed, e.g. "required" or "properties/reward/type"
	Msg    string // human readable detail
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Reason)
	if e.Path != "" || e.Rule != "" {
		fmt.Fprintf(&b, " at %q", e.Path)
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, " (rule %s)", e.Rule)
	}
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	return b.String()
}

var (
	compileOnce sync.Once
	compiled    map[Kind]*jsonschema.Schema
	compileErr  error
	printer     = message.NewPrinter(language.English)
)

func compileAll() {
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	compiled = make(map[Kind]*jsonschema.Schema)
	for _, k := range Kinds {
		raw, err := files.ReadFile(string(k) + ".schema.json")
		if err != nil {
			compileErr = err
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			compileErr = fmt.Errorf("schema %s: %w", k, err)
			return
		}
		url := "trace:" + string(k)
		if err := c.AddResource(url, doc); err != nil {
			compileErr = fmt.Errorf("schema %s: %w", k, err)
			return
		}
		s, err := c.Compile(url)
		if err != nil {
			compileErr = fmt.Errorf("schema %s: %w", k, err)
			return
		}
		compiled[k] = s
	}
}

// Source returns the JSON Schema document of a kind.
func Source(k Kind) ([]byte, error) { return files.ReadFile(string(k) + ".schema.json") }

// Validate checks a decoded JSON value (as produced by jsonschema.UnmarshalJSON
// or encoding/json with UseNumber) against the schema of kind k. It returns nil
// or an *Error naming the first failing location, ordered by path so the
// message is deterministic.
func Validate(k Kind, doc any) error {
	compileOnce.Do(compileAll)
	if compileErr != nil {
		return compileErr
	}
	s, ok := compiled[k]
	if !ok {
		return fmt.Errorf("schemas: unknown kind %q", k)
	}
	err := s.Validate(doc)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return &Error{Reason: ReasonSchema, Msg: err.Error()}
	}
	vs := Violations(ve)
	msgs := make([]string, 0, len(vs))
	for _, v := range vs {
		msgs = append(msgs, v.Path+": "+v.Msg)
	}
	if len(msgs) > 5 {
		msgs = append(msgs[:5], fmt.Sprintf("and %d more", len(msgs)-5))
	}
	return &Error{Reason: ReasonSchema, Path: vs[0].Path, Rule: vs[0].Rule, Msg: strings.Join(msgs, "; ")}
}
