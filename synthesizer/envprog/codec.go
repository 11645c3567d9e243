package envprog

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// The binary encoding of the sandbox protocol's requests and responses
// (protocol.go). A step crosses the pipe twice, and a tool result (JSON
// text) used to be escaped into a JSON string by the worker and unescaped
// by the parent, which cost the parent more than the rest of its step:
// here strings are length-prefixed bytes, copied as they are.
//
// A message is a sequence of fields in a fixed order; integers are
// varints, strings and byte strings a uvarint length and the bytes, an
// optional part a presence byte (0 or 1) then the part, a list its uvarint
// length then the elements. The rarely used Info, Reference and Stats
// travel as JSON byte strings. Decoding checks every length against what
// is left, so a damaged frame is an error, never a panic or a huge
// allocation.

var errShort = errors.New("truncated frame")

type enc struct{ b []byte }

func (e *enc) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) int(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) str(s string)  { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *enc) bytes(p []byte) {
	e.uint(uint64(len(p)))
	e.b = append(e.b, p...)
}
func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *enc) float(f float64) { e.b = binary.LittleEndian.AppendUint64(e.b, math.Float64bits(f)) }

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *dec) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// len reads a length and checks that at least min bytes per element
// remain for it.
func (d *dec) len(min int) int {
	n := d.uint()
	if n > uint64(len(d.b)/max(min, 1)) {
		d.fail(errShort)
		return 0
	}
	return int(n)
}

func (d *dec) raw() []byte {
	n := d.len(1)
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *dec) str() string { return string(d.raw()) }

func (d *dec) bytes() []byte {
	p := d.raw()
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

func (d *dec) bool() bool {
	if len(d.b) < 1 {
		d.fail(errShort)
		return false
	}
	v := d.b[0]
	d.b = d.b[1:]
	if v > 1 {
		d.fail(fmt.Errorf("bad flag byte %d", v))
	}
	return v == 1
}

func (d *dec) float() float64 {
	if len(d.b) < 8 {
		d.fail(errShort)
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(d.b))
	d.b = d.b[8:]
	return v
}

func (e *enc) toolCalls(tcs []ToolCall) {
	e.uint(uint64(len(tcs)))
	for _, tc := range tcs {
		e.str(tc.ID)
		e.str(tc.Name)
		e.bytes(tc.Arguments)
	}
}

func (d *dec) toolCalls() []ToolCall {
	n := d.len(3)
	if n == 0 {
		return nil
	}
	tcs := make([]ToolCall, n)
	for i := range tcs {
		tcs[i] = ToolCall{ID: d.str(), Name: d.str(), Arguments: d.bytes()}
	}
	return tcs
}

func (e *enc) message(m *Message) {
	e.str(m.Role)
	e.str(m.Content)
	e.toolCalls(m.ToolCalls)
	e.str(m.ToolCallID)
	e.str(m.Name)
}

func (d *dec) message() Message {
	return Message{Role: d.str(), Content: d.str(), ToolCalls: d.toolCalls(), ToolCallID: d.str(), Name: d.str()}
}

func (e *enc) reward(r *Reward) {
	e.float(r.Value)
	e.uint(uint64(len(r.Components)))
	for k, v := range r.Components {
		e.str(k)
		e.float(v)
	}
}

func (d *dec) reward() *Reward {
	r := &Reward{Value: d.float()}
	if n := d.len(9); n > 0 {
		r.Components = make(map[string]float64, n)
		for range n {
			k := d.str()
			r.Components[k] = d.float()
		}
	}
	return r
}

func (e *enc) wireErr(w *wireError) {
	e.bool(w != nil)
	if w != nil {
		e.str(w.Code)
		e.str(w.Func)
		e.int(w.Seed)
		e.str(w.Limit)
		e.str(w.Msg)
	}
}

func (d *dec) wireErr() *wireError {
	if !d.bool() {
		return nil
	}
	return &wireError{Code: d.str(), Func: d.str(), Seed: d.int(), Limit: d.str(), Msg: d.str()}
}

// jsonPart encodes a rarely used part as JSON, absent when nil.
func (e *enc) jsonPart(present bool, v any) error {
	e.bool(present)
	if !present {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	e.bytes(b)
	return nil
}

func (d *dec) jsonPart(v any) bool {
	return d.bool() && d.jsonBody(v)
}

// jsonBody decodes the JSON of a part known to be present into v.
func (d *dec) jsonBody(v any) bool {
	if b := d.raw(); d.err == nil {
		if err := json.Unmarshal(b, v); err != nil {
			d.fail(err)
		}
	}
	return d.err == nil
}

func (r *request) encode(b []byte) ([]byte, error) {
	e := enc{b}
	e.uint(r.ID)
	e.str(r.Op)
	e.uint(r.Episode)
	e.int(r.Seed)
	e.str(r.Name)
	e.bytes(r.Src)
	e.bool(r.Limits != nil)
	if l := r.Limits; l != nil {
		e.uint(l.MaxSteps)
		e.int(l.MaxMemory)
		e.int(int64(l.CallTimeout))
		e.int(int64(l.MaxTurns))
		e.int(l.ResetCache)
	}
	e.bool(r.Action != nil)
	if a := r.Action; a != nil {
		e.str(a.Content)
		e.toolCalls(a.ToolCalls)
	}
	e.uint(r.Target)
	return e.b, nil
}

func (r *request) decode(b []byte) error {
	d := dec{b: b}
	r.ID = d.uint()
	r.Op = d.str()
	r.Episode = d.uint()
	r.Seed = d.int()
	r.Name = d.str()
	r.Src = d.bytes()
	if d.bool() {
		r.Limits = &Limits{MaxSteps: d.uint(), MaxMemory: d.int(), CallTimeout: time.Duration(d.int()), MaxTurns: int(d.int()), ResetCache: d.int()}
	}
	if d.bool() {
		r.Action = &Action{Content: d.str(), ToolCalls: d.toolCalls()}
	}
	r.Target = d.uint()
	return d.end()
}

func (r *response) encode(b []byte) ([]byte, error) {
	e := enc{b}
	e.uint(r.ID)
	e.wireErr(r.Err)
	if err := e.jsonPart(r.Info != nil, r.Info); err != nil {
		return b, fmt.Errorf("info: %w", err)
	}
	e.bool(r.Start != nil)
	if s := r.Start; s != nil {
		e.str(s.System)
		e.str(s.User)
		e.bool(r.Cached)
	}
	e.bool(r.Assistant != nil)
	if m := r.Assistant; m != nil {
		e.message(m)
	}
	e.bool(r.Step != nil)
	if s := r.Step; s != nil {
		e.uint(uint64(len(s.ToolResults)))
		for i := range s.ToolResults {
			e.message(&s.ToolResults[i])
		}
		e.bool(s.Done)
	}
	e.bool(r.Reward != nil)
	if r.Reward != nil {
		e.reward(r.Reward)
	}
	e.str(r.Hint)
	if err := e.jsonPart(r.Reference != nil, r.Reference); err != nil {
		return b, fmt.Errorf("reference: %w", err)
	}
	e.bool(r.Final != nil)
	if r.Final != nil {
		e.reward(r.Final)
	}
	e.wireErr(r.FinalErr)
	if err := e.jsonPart(r.Stats != nil, r.Stats); err != nil {
		return b, fmt.Errorf("stats: %w", err)
	}
	return e.b, nil
}

func (r *response) decode(b []byte) error {
	d := dec{b: b}
	r.ID = d.uint()
	r.Err = d.wireErr()
	var info Info
	if d.jsonPart(&info) {
		r.Info = &info
	}
	if d.bool() {
		r.Start = &Start{System: d.str(), User: d.str()}
		r.Cached = d.bool()
	}
	if d.bool() {
		m := d.message()
		r.Assistant = &m
	}
	if d.bool() {
		s := &StepResult{}
		if n := d.len(5); n > 0 {
			s.ToolResults = make([]Message, n)
			for i := range s.ToolResults {
				s.ToolResults[i] = d.message()
			}
		}
		s.Done = d.bool()
		r.Step = s
	}
	if d.bool() {
		r.Reward = d.reward()
	}
	r.Hint = d.str()
	var ref []Action
	if d.jsonPart(&ref) {
		r.Reference = ref
	}
	if d.bool() {
		r.Final = d.reward()
	}
	r.FinalErr = d.wireErr()
	if d.bool() { // a stats answer: only then a value to decode into (it escapes)
		st := new(workerStats)
		if d.jsonBody(st) {
			r.Stats = st
		}
	}
	return d.end()
}

func (d *dec) end() error {
	if d.err == nil && len(d.b) > 0 {
		return fmt.Errorf("%d bytes after the end of the message", len(d.b))
	}
	return d.err
}
