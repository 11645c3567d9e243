package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ---- the oracle: the schema path, independent of codec.go and jsontext ----

// oracleDoc decodes with encoding/json (UseNumber), nothing else.
func oracleDoc(data []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if dec.Decode(&doc) != nil {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return doc, true
}

// schemaAccepts is the verdict of the JSON Schema path: encoding/json with
// UseNumber, the rollout schema, then the finite reward, on a document that
// strictSyntax finds no fault in.
func schemaAccepts(data []byte) bool {
	doc, ok := oracleDoc(data)
	if !ok {
		return false
	}
	if fault, _ := strictSyntax(data); fault != "" {
		return false
	}
	if Validate(KindRollout, doc) != nil {
		return false
	}
	reward := doc.(map[string]any)["outcome"].(map[string]any)["reward"].(json.Number)
	_, err := strconv.ParseFloat(string(reward), 64) // ±Inf comes with ErrRange
	return err == nil
}

// strictSyntax finds, in a document encoding/json reads, what RFC 7493
// forbids and encoding/json accepts: a string escaping a lone surrogate
// anywhere (fault "surrogate"), else a member name repeated in its object
// (after unescaping; fault "duplicate", with the JSON pointer of the first
// repeat). It walks encoding/json's tokens and looks at each string's text
// in the input.
func strictSyntax(data []byte) (fault, path string) {
	var dup string // the first repeat's pointer
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object bool
		names  map[string]bool
		index  int
		name   string // the member being read
		inName bool   // the next string is a name
	}
	var stack []*frame
	ptr := func(last string) string {
		var b strings.Builder
		for _, f := range stack[:len(stack)-1] {
			b.WriteByte('/')
			if f.object {
				b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(f.name))
			} else {
				b.WriteString(strconv.Itoa(f.index - 1))
			}
		}
		return b.String() + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(last)
	}
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			if dup != "" {
				return "duplicate", dup
			}
			return "", ""
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		isName := top != nil && top.object && top.inName
		if s, ok := tok.(string); ok {
			if loneSurrogate(data[start:dec.InputOffset()]) {
				return "surrogate", ""
			}
			if isName {
				if top.names[s] && dup == "" {
					dup = ptr(s)
				}
				top.names[s] = true
				top.name, top.inName = s, false
				continue
			}
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].inName = true
			}
			continue
		}
		// a value: it completes a member or an element
		if top != nil {
			if top.object {
				top.inName = true
			} else {
				top.index++
			}
		}
		if d, ok := tok.(json.Delim); ok {
			if top != nil && top.object {
				top.inName = false // the value is open
			}
			stack = append(stack, &frame{object: d == '{', names: map[string]bool{}, inName: d == '{'})
		}
	}
}

// loneSurrogate reports whether a string's JSON text escapes a surrogate
// that is not half of a high-low pair.
func loneSurrogate(text []byte) bool {
	hex := func(i int) (rune, bool) {
		if i+6 > len(text) || text[i] != '\\' || text[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(text[i+2:i+6]), 16, 32)
		return rune(v), err == nil
	}
	for i := 0; i < len(text); i++ {
		if text[i] != '\\' {
			continue
		}
		r, ok := hex(i)
		if !ok {
			i++ // a one-byte escape
			continue
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if r2, ok := hex(i + 6); ok && r2 >= 0xDC00 && r2 < 0xE000 {
				i += 11
				continue
			}
			return true
		case r >= 0xDC00 && r < 0xE000:
			return true
		}
		i += 5
	}
	return false
}

var (
	dateTimeOnce   sync.Once
	dateTimeSchema *jsonschema.Schema
)

// schemaDateTime is the schema library's own date-time format check.
func schemaDateTime(s string) bool {
	dateTimeOnce.Do(func() {
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource("dt.json", map[string]any{"type": "string", "format": "date-time"}); err != nil {
			panic(err)
		}
		dateTimeSchema = c.MustCompile("dt.json")
	})
	return dateTimeSchema.Validate(s) == nil
}

// representable walks every occurrence (duplicates included) of the values
// the schema types and reports whether the Go struct can hold them: turn_idx
// integers within an int, numbers in arguments, metadata and breakdown within
// a float64, date-times that time.Time parses. It reads encoding/json's token
// stream, so it does not share code with the fast path.
func representable(data []byte) bool {
	w := &reprWalker{dec: json.NewDecoder(bytes.NewReader(data)), ok: true}
	w.dec.UseNumber()
	defer func() {
		if p := recover(); p != nil {
			w.ok = false // a token error: not JSON
		}
	}()
	w.value(kTop)
	return w.ok
}

type reprKind int

const (
	kOther reprKind = iota
	kTop
	kMessages
	kMessage
	kToolCalls
	kToolCall
	kFree // the root of arguments or metadata: checked when an object
	kFreeValue
	kGrader
	kBreakdown
	kNumber
	kTime
	kTurnIdx
)

type reprWalker struct {
	dec *json.Decoder
	ok  bool
}

func (w *reprWalker) tok() json.Token {
	t, err := w.dec.Token()
	if err != nil {
		panic(err)
	}
	return t
}

func (w *reprWalker) value(k reprKind) {
	t := w.tok()
	switch t := t.(type) {
	case json.Delim:
		if t == '{' {
			for w.dec.More() {
				key := w.tok().(string)
				w.value(childKind(k, key, true))
			}
		} else {
			for w.dec.More() {
				w.value(childKind(k, "", false))
			}
		}
		w.tok() // closing delimiter
	case json.Number:
		switch k {
		case kNumber, kFreeValue:
			if _, err := strconv.ParseFloat(string(t), 64); err != nil {
				w.ok = false
			}
		case kTurnIdx:
			if r, ok := new(big.Rat).SetString(string(t)); ok && r.IsInt() && !r.Num().IsInt64() {
				w.ok = false
			}
		}
	case string:
		if k == kTime && schemaDateTime(t) {
			if new(time.Time).UnmarshalText([]byte(upperTZ(t))) != nil {
				w.ok = false
			}
		}
	}
}

// upperTZ upper-cases the 't' separator and a 'z' zone of an RFC 3339 time
// (RFC 3339 allows lower case; Go's parser does not).
func upperTZ(s string) string {
	if len(s) > 10 && s[10] == 't' {
		s = s[:10] + "T" + s[11:]
	}
	if strings.HasSuffix(s, "z") {
		s = s[:len(s)-1] + "Z"
	}
	return s
}

// childKind is the kind of a member (object) or element (array) of a value of
// kind k.
func childKind(k reprKind, key string, object bool) reprKind {
	switch {
	case k == kFreeValue || (k == kFree && object):
		return kFreeValue
	case k == kTop && object:
		switch key {
		case "messages":
			return kMessages
		case "metadata":
			return kFree
		case "grader":
			return kGrader
		case "start_time", "end_time":
			return kTime
		}
	case k == kMessages && !object:
		return kMessage
	case k == kMessage && object:
		switch key {
		case "tool_calls":
			return kToolCalls
		case "turn_idx":
			return kTurnIdx
		}
	case k == kToolCalls && !object:
		return kToolCall
	case k == kToolCall && object && key == "arguments":
		return kFree
	case k == kGrader && object && key == "breakdown":
		return kBreakdown
	case k == kBreakdown && object:
		return kNumber
	}
	return kOther
}

// expectedRollout builds the struct the schema's view of the document
// describes: encoding/json's generic value (last duplicate wins), reduced to
// the schema's exact (case-sensitive) keys, with integral turn_idx values
// written as integers, then unmarshalled by encoding/json.
func expectedRollout(t testing.TB, data []byte) *Rollout {
	t.Helper()
	doc, ok := oracleDoc(data)
	if !ok {
		t.Fatal("not JSON")
	}
	keep := func(m any, keys ...string) map[string]any {
		src := m.(map[string]any)
		out := map[string]any{}
		for _, k := range keys {
			if v, ok := src[k]; ok {
				out[k] = v
			}
		}
		return out
	}
	top := keep(doc, "schema", "rollout_id", "environment", "agent", "task_id", "start_time", "end_time",
		"outcome", "messages", "tools", "grader", "metadata", "conversation_id", "routing")
	for _, k := range []string{"start_time", "end_time"} {
		if s, ok := top[k].(string); ok {
			top[k] = upperTZ(s)
		}
	}
	top["agent"] = keep(top["agent"], "name", "version")
	top["outcome"] = keep(top["outcome"], "reward", "success")
	if rt, ok := top["routing"]; ok {
		r := keep(rt, "decision_id", "adapter")
		if r["adapter"] == nil {
			delete(r, "adapter") // null: the base model, as absent
		}
		top["routing"] = r
	}
	var msgs []any
	for _, m := range top["messages"].([]any) {
		mm := keep(m, "role", "content", "reasoning", "tool_calls", "tool_call_id", "error", "error_text", "requestor", "turn_idx")
		if n, ok := mm["turn_idx"].(json.Number); ok {
			r, _ := new(big.Rat).SetString(string(n))
			mm["turn_idx"] = json.Number(r.Num().String())
		}
		if calls, ok := mm["tool_calls"].([]any); ok {
			var cs []any
			for _, c := range calls {
				cs = append(cs, keep(c, "id", "name", "arguments", "requestor"))
			}
			if cs == nil {
				cs = []any{}
			}
			mm["tool_calls"] = cs
		}
		msgs = append(msgs, mm)
	}
	top["messages"] = msgs
	if tools, ok := top["tools"].([]any); ok {
		ts := []any{}
		for _, tl := range tools {
			tt := keep(tl, "type", "function")
			tt["function"] = keep(tt["function"], "name", "description", "parameters")
			ts = append(ts, tt)
		}
		top["tools"] = ts
	}
	if g, ok := top["grader"]; ok {
		top["grader"] = keep(g, "reasons", "breakdown")
	}
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	var r Rollout
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("oracle unmarshal: %v\n%s", err, b)
	}
	return &r
}

// canonicalParameters rewrites raw parameters to encoding/json's canonical
// form, so that rollouts compare by value.
func canonicalParameters(t testing.TB, r *Rollout) {
	r.Tools = slices.Clone(r.Tools)
	for i := range r.Tools {
		p := r.Tools[i].Function.Parameters
		if p == nil {
			continue
		}
		var v any
		if err := json.Unmarshal(p, &v); err != nil {
			t.Fatalf("parameters %s: %v", p, err)
		}
		r.Tools[i].Function.Parameters, _ = json.Marshal(v)
	}
}

// checkParser is the differential property: the parser accepts exactly what
// the schema path accepts and the Go types can hold, it decodes the value
// the schema's view describes, its raw values are the input's text of those
// values, and a rejection carries the reason the oracle expects (a repeated
// name: duplicate_key at the repeat's path).
func checkParser(t testing.TB, data []byte) {
	t.Helper()
	if precheck(data, DecodeOptions{}) != nil {
		return // size, emptiness and UTF-8 are checked before either path
	}
	raw, why := parseRollout(data)
	ref, refWhy := parseJSONText(data)
	if (raw != nil) != (ref != nil) {
		t.Fatalf("scanRollout accepts=%v (%s), parseJSONText accepts=%v (%s)\n%q", raw != nil, why, ref != nil, refWhy, data)
	}
	if raw != nil && !reflect.DeepEqual(raw, ref) {
		t.Fatalf("scanRollout and parseJSONText read different values\n%+v\n%+v\n%q", raw, ref, data)
	}
	schemaOK := schemaAccepts(data)
	want := schemaOK && representable(data)
	if (raw != nil) != want {
		t.Fatalf("parser accepts=%v (%s), schema accepts=%v, representable=%v\n%q",
			raw != nil, why, schemaOK, want || !schemaOK, data)
	}
	r, err := DecodeRollout(data, DecodeOptions{})
	if (err == nil) != want {
		t.Fatalf("DecodeRollout err=%v, want accepted=%v\n%q", err, want, data)
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Reason == "" {
			t.Fatalf("rejection without a reason: %v", err)
		}
		_, jsonOK := oracleDoc(data)
		fault, path := strictSyntax(data)
		switch {
		case !jsonOK:
			if e.Reason != ReasonNotJSON && e.Reason != ReasonNonFiniteReward {
				t.Fatalf("not JSON, but reason %s (%v)\n%q", e.Reason, err, data)
			}
		case fault == "duplicate":
			// The error bounds a long pointer to 512 bytes and "…".
			if e.Reason != ReasonDuplicateKey || e.Path != clip(path) {
				t.Fatalf("repeated name at %s, but %v (path %q)\n%q", path, err, e.Path, data)
			}
		case fault == "surrogate":
			if e.Reason != ReasonNotJSON {
				t.Fatalf("lone surrogate, but %v\n%q", err, data)
			}
		case e.Reason == ReasonDuplicateKey || e.Reason == ReasonNotJSON:
			t.Fatalf("strict JSON, but %v\n%q", err, data)
		}
		return
	}
	exp := expectedRollout(t, data)
	canonicalParameters(t, r)
	if !reflect.DeepEqual(r, exp) {
		gb, _ := json.Marshal(r)
		eb, _ := json.Marshal(exp)
		t.Fatalf("decoded\n%s\nwant\n%s\ninput %q", gb, eb, data)
	}
	checkRawValues(t, data, raw, exp)
}

// checkRawValues: every raw value is a part of the input, and reads as the
// value the oracle decoded.
func checkRawValues(t testing.TB, data []byte, raw *RawRollout, exp *Rollout) {
	t.Helper()
	within := func(v []byte) {
		if len(v) > 0 && !bytes.Contains(data, v) {
			t.Fatalf("raw value %q is not a part of the input", v)
		}
	}
	same := func(what string, v []byte, want any) {
		t.Helper()
		within(v)
		if v == nil {
			return
		}
		got := reflect.New(reflect.TypeOf(want)).Interface()
		if err := json.Unmarshal(v, got); err != nil {
			t.Fatalf("%s: raw %q: %v", what, v, err)
		}
		if g := reflect.ValueOf(got).Elem().Interface(); !reflect.DeepEqual(g, want) {
			t.Fatalf("%s: raw %q reads %v, want %v", what, v, g, want)
		}
	}
	for i, m := range raw.Messages {
		em := exp.Messages[i]
		same("content", m.Content, em.Content)
		same("reasoning", m.Reasoning, em.Reasoning)
		for j, tc := range m.ToolCalls {
			same("arguments", tc.Arguments, em.ToolCalls[j].Arguments)
		}
	}
	if exp.Metadata != nil {
		same("metadata", raw.Metadata, exp.Metadata)
	}
	within(raw.Tools)
	within(raw.Grader)
}

// ---- documents: a valid rollout as ordered members, to mutate ----

type member struct{ k, v string }
type obj []member

func (o obj) String() string {
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(m.k))
		b.WriteByte(':')
		b.WriteString(m.v)
	}
	b.WriteByte('}')
	return b.String()
}

// set replaces every member k with v (or appends it); del removes k; add
// appends (a duplicate when k exists); rename changes the key.
func (o obj) set(k, v string) obj {
	out, done := obj{}, false
	for _, m := range o {
		if m.k == k {
			if !done {
				out = append(out, member{k, v})
				done = true
			}
			continue
		}
		out = append(out, m)
	}
	if !done {
		out = append(out, member{k, v})
	}
	return out
}

func (o obj) del(k string) obj {
	out := obj{}
	for _, m := range o {
		if m.k != k {
			out = append(out, m)
		}
	}
	return out
}

func (o obj) add(k, v string) obj { return append(append(obj{}, o...), member{k, v}) }

func (o obj) rename(k, nk string) obj {
	out := obj{}
	for _, m := range o {
		if m.k == k {
			m.k = nk
		}
		out = append(out, m)
	}
	return out
}

func arr(items ...string) string { return "[" + strings.Join(items, ",") + "]" }

func q(s string) string { b, _ := json.Marshal(s); return string(b) }

var (
	baseAgent    = obj{{"name", `"a"`}, {"version", `"v1"`}}
	baseOutcome  = obj{{"reward", `0.5`}}
	baseCall     = obj{{"id", `"c1"`}, {"name", `"get_user"`}, {"arguments", `{"user_id":"u1","n":2,"deep":[1,{"x":null}]}`}}
	baseUser     = obj{{"role", `"user"`}, {"content", `"hi"`}, {"turn_idx", `1`}}
	baseAsst     = obj{{"role", `"assistant"`}, {"content", `null`}, {"tool_calls", arr(baseCall.String())}}
	baseToolMsg  = obj{{"role", `"tool"`}, {"tool_call_id", `"c1"`}, {"content", `"{}"`}, {"error", `false`}, {"requestor", `"assistant"`}}
	baseFunction = obj{{"name", `"get_user"`}, {"description", `"d"`}, {"parameters", `{"type": "object", "properties": {}}`}}
	baseTool     = obj{{"type", `"function"`}, {"function", baseFunction.String()}}
	baseGrader   = obj{{"reasons", `["db mismatch"]`}, {"breakdown", `{"DB":0,"COMM":1.5}`}}
)

func baseMessages(m ...obj) string {
	if len(m) == 0 {
		m = []obj{{{"role", `"system"`}, {"content", `"policy"`}}, baseUser, baseAsst, baseToolMsg}
	}
	items := make([]string, len(m))
	for i, o := range m {
		items[i] = o.String()
	}
	return arr(items...)
}

func baseTop() obj {
	return obj{
		{"schema", `"rollout/v1"`}, {"rollout_id", `"r1"`}, {"environment", `"tau2-airline"`},
		{"agent", baseAgent.String()}, {"task_id", `"7"`},
		{"start_time", `"2026-01-01T00:00:00Z"`}, {"end_time", `"2026-01-01T00:01:00.5+02:00"`},
		{"outcome", baseOutcome.String()}, {"messages", baseMessages()},
		{"tools", arr(baseTool.String())}, {"grader", baseGrader.String()}, {"metadata", `{"k":1,"s":"x"}`},
		{"conversation_id", `"c1"`}, {"routing", baseRouting.String()},
	}
}

var baseRouting = obj{{"decision_id", `"d1"`}, {"adapter", `"tau2-airline-precondition-r1"`}}

// Values of every JSON kind, plus a few that break specific keywords.
var anyKind = []string{`null`, `true`, `false`, `0`, `-1`, `1.5`, `1e400`, `""`, `"x"`, `{}`, `[]`, `[1]`, `{"a":1}`}

// seedDocs are the valid document and mutations of every field kind.
func seedDocs() []string {
	top := baseTop()
	var docs []string
	add := func(o obj) { docs = append(docs, o.String()) }
	add(top)
	add(obj{{"rollout_id", `"r"`}, {"environment", `"e"`}, {"agent", baseAgent.String()}, {"task_id", `"t"`},
		{"outcome", `{"reward":1}`}, {"messages", `[{"role":"user"}]`}})

	// Every top-level member: absent, of every kind, duplicated both ways,
	// and under a key of another case.
	for _, m := range top {
		add(top.del(m.k))
		for _, v := range anyKind {
			add(top.set(m.k, v))
			add(top.add(m.k, v))               // a bad value after the good one
			add(top.set(m.k, v).add(m.k, m.v)) // the good one after a bad one
		}
		add(top.rename(m.k, strings.ToUpper(m.k[:1])+m.k[1:]))
		add(top.add(strings.ToUpper(m.k), `"zz"`))
	}
	long := func(s string, n int) string { return q(strings.Repeat(s, n)) }
	for _, v := range []string{long("x", 256), long("x", 257), long("é", 256), long("é", 257), `"\u00e9"`, `"\ud83d\ude00"`, `"\ud800"`, `"\ud800\u0041"`, `"a\"b"`} {
		add(top.set("rollout_id", v))
		add(top.set("task_id", v))
		add(top.set("agent", baseAgent.set("name", v).String()))
		add(top.set("agent", baseAgent.set("version", v).String()))
	}
	for _, v := range []string{long("a", 128), long("a", 129), `"a"`, `"_a"`, `"a b"`, `"a\n"`, `"tau2-x:y.z_w"`, `"é"`, `"\u0061b"`, `"-a"`, `"A9"`} {
		add(top.set("environment", v))
	}
	for _, v := range []string{long("x", 256), long("x", 257), `""`, `1`, `null`} {
		add(top.set("conversation_id", v))
		add(top.set("routing", baseRouting.set("adapter", v).String()))
	}
	for _, v := range []string{long("x", 128), long("x", 129), `""`, `1`, `null`} {
		add(top.set("routing", baseRouting.set("decision_id", v).String()))
	}
	add(top.set("routing", baseRouting.del("decision_id").String()))
	add(top.set("routing", baseRouting.del("adapter").String()))
	add(top.set("routing", baseRouting.add("adapter", `null`).String()))
	add(top.set("routing", baseRouting.add("extra", `[1]`).String()))
	add(top.set("agent", baseAgent.del("name").String()))
	add(top.set("agent", baseAgent.del("version").String()))
	add(top.set("agent", baseAgent.add("name", `1`).String()))
	add(top.set("agent", baseAgent.rename("name", "Name").String()))
	add(top.set("schema", `"rollout/v2"`))
	add(top.set("schema", `"rollout\/v1"`))
	for _, v := range []string{`"2026-01-01T00:00:00Z"`, `"2026-01-01t00:00:00z"`, `"2026-01-01T00:00:00+01:00"`, `"2026-01-01T00:00:00-23:59"`,
		`"2026-12-31T23:59:60Z"`, `"2026-01-01T00:59:60+01:00"`, `"2026-02-30T00:00:00Z"`, `"2026-01-01T24:00:00Z"`,
		`"2026-01-01T00:00:00.123456789Z"`, `"2026-01-01T00:00:00.Z"`, `"2026-01-01 00:00:00Z"`, `"2026-01-01T+1:00:00Z"`,
		`"2026-01-01T00:00:00+24:00"`, `"2026-01-01T00:00:00"`, `"2026-01-01T00:00:00+0100"`, `"yesterday"`, `"2026-01-01T00:00:00\u005a"`} {
		add(top.set("start_time", v))
		add(top.set("end_time", v).add("end_time", `"2026-01-01T00:00:00Z"`))
	}
	for _, v := range []string{`1`, `1.0`, `-0`, `1e308`, `1e309`, `-1e309`, `1e-400`, `NaN`, `Infinity`, `-Infinity`, `"1"`, `null`, `true`, `01`, `1.`, `.5`, `+1`} {
		add(top.set("outcome", baseOutcome.set("reward", v).String()))
	}
	for _, v := range anyKind {
		add(top.set("outcome", baseOutcome.add("success", v).String()))
	}
	add(top.set("outcome", baseOutcome.del("reward").add("Reward", `1`).String()))
	add(top.set("outcome", obj{{"reward", `1e999`}, {"reward", `1`}}.String()))
	add(top.set("outcome", obj{{"reward", `1`}, {"reward", `1e999`}}.String()))

	// Messages.
	add(top.set("messages", `[]`))
	for _, v := range anyKind {
		add(top.set("messages", arr(v)))
		add(top.set("messages", arr(baseUser.String(), v)))
	}
	msgs := map[string]obj{"user": baseUser, "assistant": baseAsst, "tool": baseToolMsg}
	for _, name := range []string{"user", "assistant", "tool"} {
		m := msgs[name]
		for _, k := range []string{"role", "content", "reasoning", "tool_calls", "tool_call_id", "error", "error_text", "requestor", "turn_idx"} {
			add(top.set("messages", baseMessages(m.del(k))))
			for _, v := range anyKind {
				add(top.set("messages", baseMessages(m.set(k, v))))
				add(top.set("messages", baseMessages(m.set(k, v).add(k, v))))
			}
			add(top.set("messages", baseMessages(m.rename(k, strings.ToUpper(k)))))
		}
	}
	for _, v := range []string{`"system"`, `"user"`, `"assistant"`, `"tool"`, `"robot"`, `"User"`, `"tool "`} {
		add(top.set("messages", baseMessages(baseUser.set("role", v))))
		add(top.set("messages", baseMessages(baseToolMsg.set("role", v))))
		add(top.set("messages", baseMessages(baseToolMsg.del("tool_call_id").set("role", v))))
	}
	add(top.set("messages", baseMessages(baseToolMsg.set("tool_call_id", `""`))))
	add(top.set("messages", baseMessages(baseToolMsg.set("role", `"user"`).add("role", `"tool"`).del("tool_call_id"))))
	add(top.set("messages", baseMessages(baseToolMsg.set("role", `"tool"`).add("role", `"user"`).del("tool_call_id"))))
	for _, v := range []string{`"assistant"`, `"user"`, `"system"`, `"Assistant"`} {
		add(top.set("messages", baseMessages(baseToolMsg.set("requestor", v))))
	}
	for _, v := range []string{`0`, `-0`, `1.0`, `1.5`, `1e2`, `1E+2`, `1e-2`, `10e-1`, `100e-2`, `0.0e-5`, `-1`,
		`9223372036854775807`, `9223372036854775808`, `-9223372036854775808`, `-9223372036854775809`, `1e19`, `1e18`,
		`0e99999999999`, `0e999999999999999999999`, `1e1000001`, `5` + strings.Repeat("0", 20) + `e-20`, `"1"`, `null`} {
		add(top.set("messages", baseMessages(baseUser.set("turn_idx", v))))
		add(top.set("messages", baseMessages(baseUser.set("turn_idx", v).add("turn_idx", `3`))))
	}
	for _, v := range []string{`"x"`, `""`, `"\u0000"`, "\"a\\u2028b\"", `"<&>"`, q(strings.Repeat("é", 400)),
		q("\n\n\n" + strings.Repeat("a", 16)), q(strings.Repeat("ab\"", 30))} {
		add(top.set("messages", baseMessages(baseUser.set("content", v))))
	}

	// Tool calls.
	calls := func(c ...string) string { return baseMessages(baseAsst.set("tool_calls", arr(c...))) }
	add(top.set("messages", calls()))
	for _, v := range anyKind {
		add(top.set("messages", calls(v)))
	}
	for _, k := range []string{"id", "name", "arguments", "requestor"} {
		add(top.set("messages", calls(baseCall.del(k).String())))
		for _, v := range anyKind {
			add(top.set("messages", calls(baseCall.set(k, v).String())))
			add(top.set("messages", calls(baseCall.set(k, v).add(k, baseCall.set(k, `"x"`)[0].v).String())))
		}
		add(top.set("messages", calls(baseCall.rename(k, strings.ToUpper(k)).String())))
	}
	for _, v := range []string{`{}`, `{"a":1e999}`, `{"a":1e999,"a":1}`, `{"a":[1,{"b":-1e-400}]}`, `{"a":"x","a":{"b":[]}}`, `{"":null}`} {
		add(top.set("messages", calls(baseCall.set("arguments", v).String())))
	}
	add(top.set("messages", calls(baseCall.set("requestor", `"user"`).String(), baseCall.set("id", `"c2"`).String())))

	// Tools.
	for _, v := range anyKind {
		add(top.set("tools", arr(v)))
		add(top.set("tools", arr(baseTool.set("type", v).String())))
		add(top.set("tools", arr(baseTool.set("function", v).String())))
		for _, k := range []string{"name", "description", "parameters"} {
			add(top.set("tools", arr(baseTool.set("function", baseFunction.set(k, v).String()).String())))
		}
	}
	add(top.set("tools", arr(baseTool.del("type").String())))
	add(top.set("tools", arr(baseTool.del("function").String())))
	add(top.set("tools", arr(baseTool.set("type", `"Function"`).String())))
	for _, k := range []string{"name", "description", "parameters"} {
		add(top.set("tools", arr(baseTool.set("function", baseFunction.del(k).String()).String())))
	}
	add(top.set("tools", arr(baseTool.set("function", baseFunction.set("parameters", "{ \"a\" : [ 1 , 2 ] ,\n \"b\":{}}").add("parameters", `{"z":true}`).String()).String())))

	// Grader and metadata.
	for _, v := range anyKind {
		add(top.set("grader", baseGrader.set("reasons", v).String()))
		add(top.set("grader", baseGrader.set("reasons", arr(v)).String()))
		add(top.set("grader", baseGrader.set("breakdown", v).String()))
		add(top.set("grader", baseGrader.set("breakdown", `{"a":`+v+`}`).String()))
		add(top.set("grader", baseGrader.set("breakdown", `{"a":`+v+`,"a":1}`).String()))
		add(top.set("grader", baseGrader.set("breakdown", `{"a":1,"a":`+v+`}`).String()))
		add(top.set("metadata", `{"a":`+v+`}`))
	}
	add(top.set("metadata", `{"a":1e999,"a":1}`))
	add(top.set("metadata", `{"a":{"b":1,"b":1}}`))
	add(top.set("metadata", `{"a":1,"\u0061":1}`))
	add(top.add("environment", `"other"`))
	add(top.set("messages", calls(baseCall.set("arguments", `{"x":[{"y":1,"y":2}]}`).String())))
	add(top.set("messages", baseMessages(baseAsst.set("reasoning", `"why"`), baseToolMsg.set("error", `true`).set("error_text", `"failed"`))))
	add(top.set("messages", baseMessages(baseUser.set("content", `"\udc00"`).add("content", `"x"`))))
	add(top.set("metadata", strings.Repeat(`{"a":`, 300)+`1`+strings.Repeat(`}`, 300)))

	// Syntax around a valid document.
	valid := top.String()
	for _, s := range []string{" " + valid + "\n\t\r ", valid + "x", valid + "{}", valid + "]", "\ufeff" + valid, valid[:len(valid)-1],
		`[` + valid + `]`, `"x"`, `1`, `null`, `{}`, `{"rollout_id":}`, `{"a" 1}`, `{"a":1,}`, `{,}`, "{\"a\":\"\x01\"}",
		`{"a":"\x"}`, `{"a":"\u12"}`, `{"a":tru}`, `{"a":nul}`, `{"a":-}`, `{"a":1.e1}`, `{"a":1e}`, `{"a":--1}`,
		strings.Replace(valid, `"hi"`, `"h\ti"`, 1)} {
		docs = append(docs, s)
	}
	return docs
}

func TestParserMatchesSchemaOnSeeds(t *testing.T) {
	docs := seedDocs()
	accepted := 0
	for _, d := range docs {
		checkParser(t, []byte(d))
		if r, _ := parseRollout([]byte(d)); r != nil {
			accepted++
		}
	}
	t.Logf("%d documents, %d accepted", len(docs), accepted)
	if accepted < 50 || accepted > len(docs)-50 {
		t.Fatalf("seeds are lopsided: %d of %d accepted", accepted, len(docs))
	}
}

// FuzzParserMatchesSchema: go test -fuzz=FuzzParserMatchesSchema ./schemas/
// (CI runs it for 60 s.)
func FuzzParserMatchesSchema(f *testing.F) {
	for _, d := range seedDocs() {
		f.Add([]byte(d))
	}
	f.Add([]byte(validRollout))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		checkParser(t, data)
	})
}

// TestParserConstraints names the verdict of each constraint explicitly.
func TestParserConstraints(t *testing.T) {
	top := baseTop()
	msg := func(o obj) obj { return top.set("messages", baseMessages(o)) }
	call := func(o obj) obj { return top.set("messages", baseMessages(baseAsst.set("tool_calls", arr(o.String())))) }
	tool := func(o obj) obj { return top.set("tools", arr(o.String())) }
	fn := func(o obj) obj { return tool(baseTool.set("function", o.String())) }
	tests := []struct {
		name string
		doc  obj
		ok   bool
	}{
		{"valid", top, true},
		{"minimal", obj{{"rollout_id", `"r"`}, {"environment", `"e"`}, {"agent", baseAgent.String()}, {"task_id", `"t"`}, {"outcome", `{"reward":1}`}, {"messages", `[{"role":"user"}]`}}, true},
		{"required rollout_id", top.del("rollout_id"), false},
		{"required environment", top.del("environment"), false},
		{"required agent", top.del("agent"), false},
		{"required task_id", top.del("task_id"), false},
		{"required outcome", top.del("outcome"), false},
		{"required messages", top.del("messages"), false},
		{"optional members absent", top.del("schema").del("start_time").del("end_time").del("tools").del("grader").del("metadata"), true},
		{"key case matters", top.rename("rollout_id", "Rollout_ID"), false},
		{"key of another case is unknown", top.add("ROLLOUT_ID", `5`), true},
		{"a repeated key is refused (valid last)", top.set("rollout_id", `5`).add("rollout_id", `"r2"`), false},
		{"a repeated key is refused (same value)", top.add("rollout_id", `"r1"`), false},
		{"null rollout_id", top.set("rollout_id", `null`), false},
		{"rollout_id empty", top.set("rollout_id", `""`), false},
		{"rollout_id 256 runes", top.set("rollout_id", q(strings.Repeat("é", 256))), true},
		{"rollout_id 257 runes", top.set("rollout_id", q(strings.Repeat("x", 257))), false},
		{"environment 128", top.set("environment", q(strings.Repeat("a", 128))), true},
		{"environment 129", top.set("environment", q(strings.Repeat("a", 129))), false},
		{"environment pattern first char", top.set("environment", `"-a"`), false},
		{"environment pattern rest", top.set("environment", `"a:b.c_d-e"`), true},
		{"environment trailing newline", top.set("environment", `"a\n"`), false},
		{"environment escaped", top.set("environment", `"\u0061"`), true},
		{"agent name missing", top.set("agent", baseAgent.del("name").String()), false},
		{"agent version 129", top.set("agent", baseAgent.set("version", q(strings.Repeat("v", 129))).String()), false},
		{"agent not an object", top.set("agent", `"a"`), false},
		{"task_id number", top.set("task_id", `7`), false},
		{"schema const", top.set("schema", `"rollout/v2"`), false},
		{"schema escaped", top.set("schema", `"rollout\/v1"`), true},
		{"start_time lowercase", top.set("start_time", `"2026-01-01t00:00:00z"`), true},
		{"start_time offset", top.set("start_time", `"2026-01-01T00:00:00-07:30"`), true},
		{"start_time no zone", top.set("start_time", `"2026-01-01T00:00:00"`), false},
		{"start_time bad date", top.set("start_time", `"2026-02-30T00:00:00Z"`), false},
		{"start_time leap second (time.Time cannot hold it)", top.set("start_time", `"2026-12-31T23:59:60Z"`), false},
		{"start_time null", top.set("start_time", `null`), false},
		{"end_time number", top.set("end_time", `0`), false},
		{"reward integer", top.set("outcome", `{"reward":1}`), true},
		{"reward string", top.set("outcome", `{"reward":"1"}`), false},
		{"reward null", top.set("outcome", `{"reward":null}`), false},
		{"reward overflow", top.set("outcome", `{"reward":1e309}`), false},
		{"reward NaN", top.set("outcome", `{"reward":NaN}`), false},
		{"reward missing", top.set("outcome", `{"success":true}`), false},
		{"success boolean", top.set("outcome", `{"reward":0,"success":true}`), true},
		{"success null", top.set("outcome", `{"reward":0,"success":null}`), false},
		{"messages empty", top.set("messages", `[]`), false},
		{"messages null", top.set("messages", `null`), false},
		{"message not an object", top.set("messages", `[1]`), false},
		{"role missing", msg(baseUser.del("role")), false},
		{"role enum", msg(baseUser.set("role", `"robot"`)), false},
		{"role case", msg(baseUser.set("role", `"User"`)), false},
		{"content null", msg(baseUser.set("content", `null`)), true},
		{"content number", msg(baseUser.set("content", `1`)), false},
		{"tool_calls null", msg(baseAsst.set("tool_calls", `null`)), true},
		{"tool_calls object", msg(baseAsst.set("tool_calls", `{}`)), false},
		{"tool message without tool_call_id", msg(baseToolMsg.del("tool_call_id")), false},
		{"tool message with empty tool_call_id", msg(baseToolMsg.set("tool_call_id", `""`)), true},
		{"tool_call_id null", msg(baseToolMsg.set("tool_call_id", `null`)), false},
		{"user message without tool_call_id", msg(baseUser), true},
		{"error not boolean", msg(baseToolMsg.set("error", `0`)), false},
		{"requestor enum", msg(baseToolMsg.set("requestor", `"system"`)), false},
		{"turn_idx 1.0 is an integer", msg(baseUser.set("turn_idx", `1.0`)), true},
		{"turn_idx 1e2 is an integer", msg(baseUser.set("turn_idx", `1e2`)), true},
		{"turn_idx 1.5", msg(baseUser.set("turn_idx", `1.5`)), false},
		{"turn_idx string", msg(baseUser.set("turn_idx", `"1"`)), false},
		{"turn_idx null", msg(baseUser.set("turn_idx", `null`)), false},
		{"turn_idx max int64", msg(baseUser.set("turn_idx", `9223372036854775807`)), true},
		{"turn_idx beyond int64 (int cannot hold it)", msg(baseUser.set("turn_idx", `9223372036854775808`)), false},
		{"tool call id empty", call(baseCall.set("id", `""`)), false},
		{"tool call name missing", call(baseCall.del("name")), false},
		{"tool call arguments missing", call(baseCall.del("arguments")), false},
		{"tool call arguments string", call(baseCall.set("arguments", `"{}"`)), false},
		{"tool call arguments null", call(baseCall.set("arguments", `null`)), false},
		{"tool call arguments empty", call(baseCall.set("arguments", `{}`)), true},
		{"tool call arguments huge number (float64 cannot hold it)", call(baseCall.set("arguments", `{"a":1e999}`)), false},
		{"tool call requestor", call(baseCall.set("requestor", `"user"`)), true},
		{"tool call requestor enum", call(baseCall.set("requestor", `"tool"`)), false},
		{"tools empty", top.set("tools", `[]`), true},
		{"tools object", top.set("tools", `{}`), false},
		{"tool type const", tool(baseTool.set("type", `"fn"`)), false},
		{"tool function missing", tool(baseTool.del("function")), false},
		{"tool function name empty", fn(baseFunction.set("name", `""`)), false},
		{"tool function name missing", fn(baseFunction.del("name")), false},
		{"tool description number", fn(baseFunction.set("description", `1`)), false},
		{"tool parameters array", fn(baseFunction.set("parameters", `[]`)), false},
		{"tool parameters absent", fn(baseFunction.del("parameters")), true},
		{"grader empty", top.set("grader", `{}`), true},
		{"grader null", top.set("grader", `null`), false},
		{"grader reasons not strings", top.set("grader", `{"reasons":[1]}`), false},
		{"grader breakdown not numbers", top.set("grader", `{"breakdown":{"a":"1"}}`), false},
		{"grader breakdown repeated key", top.set("grader", `{"breakdown":{"a":1,"a":1}}`), false},
		{"reasoning string", msg(baseAsst.set("reasoning", `"because"`)), true},
		{"reasoning null", msg(baseAsst.set("reasoning", `null`)), true},
		{"reasoning number", msg(baseAsst.set("reasoning", `1`)), false},
		{"error_text string", msg(baseAsst.set("error", `true`).set("error_text", `"timeout"`)), true},
		{"error_text null", msg(baseAsst.set("error_text", `null`)), false},
		{"lone surrogate escape", msg(baseUser.set("content", `"\ud800"`)), false},
		{"metadata array", top.set("metadata", `[]`), false},
		{"metadata null", top.set("metadata", `null`), false},
		{"metadata anything inside", top.set("metadata", `{"a":[null,true,{"b":"c"}]}`), true},
		{"unknown members", top.add("extra", `{"x":[1,2,{"y":null}]}`), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := []byte(tt.doc.String())
			r, why := parseRollout(doc)
			if (r != nil) != tt.ok {
				t.Fatalf("parser accepts=%v (%s), want %v\n%s", r != nil, why, tt.ok, doc)
			}
			checkParser(t, doc)
		})
	}
	for _, s := range []string{`[1,2]`, `"x"`, `{}`, `{"rollout_id":"r"`, baseTop().String() + "x"} {
		if r, _ := parseRollout([]byte(s)); r != nil {
			t.Errorf("accepted %q", s)
		}
	}
}

func TestDecodesValues(t *testing.T) {
	doc := baseTop().set("messages", baseMessages(
		baseUser.set("content", `"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00x"`).set("turn_idx", `1e1`),
		baseAsst.set("reasoning", `"think\u0021"`), baseToolMsg.set("error", `true`).set("error_text", `"boom"`))).String()
	r, err := DecodeRollout([]byte(doc), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Messages[0].Content, "a\"b\\c/d\b\f\n\r\té😀x"; got != want {
		t.Errorf("content %q, want %q", got, want)
	}
	if *r.Messages[0].TurnIdx != 10 || !r.Messages[2].Error || r.Messages[2].ErrorText != "boom" || r.Messages[1].Content != "" || r.Messages[1].Reasoning != "think!" {
		t.Errorf("messages %+v", r.Messages)
	}
	if args := r.Messages[1].ToolCalls[0].Arguments; args["n"] != 2.0 || args["deep"].([]any)[1].(map[string]any)["x"] != nil {
		t.Errorf("arguments %#v", args)
	}
	if string(r.Tools[0].Function.Parameters) != `{"type": "object", "properties": {}}` {
		t.Errorf("parameters %s", r.Tools[0].Function.Parameters)
	}
	if r.EndTime.Format(time.RFC3339Nano) != "2026-01-01T00:01:00.5+02:00" || r.Grader.Breakdown["COMM"] != 1.5 {
		t.Errorf("end %v grader %+v", r.EndTime, r.Grader)
	}
	checkParser(t, []byte(doc))
}

// TestErrorsComeFromTheSchema: a rejected message gets the schema
// library's error.
func TestErrorsComeFromTheSchema(t *testing.T) {
	_, err := DecodeRollout([]byte(baseTop().set("rollout_id", `5`).String()), DecodeOptions{})
	var e *Error
	if !errors.As(err, &e) || e.Reason != ReasonSchema || e.Path != "/rollout_id" || !strings.Contains(e.Rule, "type") {
		t.Fatalf("err = %v", err)
	}
	_, err = DecodeRollout([]byte(baseTop().set("messages", baseMessages(baseUser.set("turn_idx", `1e30`))).String()), DecodeOptions{})
	if !errors.As(err, &e) || e.Reason != ReasonSchema || !strings.Contains(e.Msg, "does not fit an int") {
		t.Fatalf("err = %v", err)
	}
}

// TestNeverKeepsInput: a decoded rollout must not alias the caller's
// buffer, which the consumer reuses (only RawRollout's values do).
func TestNeverKeepsInput(t *testing.T) {
	doc := []byte(baseTop().String())
	r, err := DecodeRollout(doc, DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := fmt.Sprintf("%+v", *r)
	for i := range doc {
		doc[i] = 'X'
	}
	if after := fmt.Sprintf("%+v", *r); after != before {
		t.Fatal("decoded rollout changed with its input buffer")
	}
}

// A repeated member name is refused wherever it is, with reason
// duplicate_key and the JSON pointer of the repeat, also where the last
// value alone would be valid and where the names differ only in escapes.
func TestDuplicateKeys(t *testing.T) {
	top := baseTop()
	call := func(args string) obj {
		return top.set("messages", baseMessages(baseAsst.set("tool_calls", arr(baseCall.set("arguments", args).String()))))
	}
	tests := []struct {
		name string
		doc  string
		path string
	}{
		{"rollout_id", top.add("rollout_id", `"r2"`).String(), "/rollout_id"},
		{"environment", top.add("environment", `"other"`).String(), "/environment"},
		{"escaped repeat", top.add("rollout\u005fid", `"r2"`).String(), "/rollout_id"},
		{"agent version", top.set("agent", baseAgent.add("version", `"v2"`).String()).String(), "/agent/version"},
		{"message role", top.set("messages", baseMessages(baseUser, baseUser.add("role", `"assistant"`))).String(), "/messages/1/role"},
		{"tool-call arguments", call(`{"user_id":"u1","user_id":"u2"}`).String(), "/messages/0/tool_calls/0/arguments/user_id"},
		{"deep in arguments", call(`{"a":[1,{"b":{"c":1,"c":2}}]}`).String(), "/messages/0/tool_calls/0/arguments/a/1/b/c"},
		{"metadata", top.set("metadata", `{"k":1,"k":1}`).String(), "/metadata/k"},
		{"metadata name with a slash", top.set("metadata", `{"a/b~":1,"a/b~":2}`).String(), "/metadata/a~1b~0"},
		{"grader breakdown", top.set("grader", `{"breakdown":{"DB":0,"DB":1}}`).String(), "/grader/breakdown/DB"},
		{"unknown member", top.add("extra", `{"x":1,"x":2}`).String(), "/extra/x"},
		{"tool parameters", top.set("tools", arr(baseTool.set("function", baseFunction.set("parameters", `{"type":"object","type":"object"}`).String()).String())).String(), "/tools/0/function/parameters/type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRollout([]byte(tt.doc), DecodeOptions{})
			var e *Error
			if !errors.As(err, &e) || e.Reason != ReasonDuplicateKey || e.Path != tt.path {
				t.Fatalf("err = %v (path %q), want %s at %s", err, pathOf(e), ReasonDuplicateKey, tt.path)
			}
			checkParser(t, []byte(tt.doc))
		})
	}
	// Label events and synthesis requests share the strict syntax check.
	_, err := DecodeLabel([]byte(`{"rollout_id":"r","rollout_id":"s"}`), DecodeOptions{})
	if e := (*Error)(nil); !errors.As(err, &e) || e.Reason != ReasonDuplicateKey || e.Path != "/rollout_id" {
		t.Fatalf("label: %v", err)
	}
	_, err = DecodeSynthesisRequest([]byte(`{"capability":{"skill":"a","skill":"b"}}`))
	if e := (*Error)(nil); !errors.As(err, &e) || e.Reason != ReasonDuplicateKey || e.Path != "/capability/skill" {
		t.Fatalf("synthesis request: %v", err)
	}
}

func pathOf(e *Error) string {
	if e == nil {
		return ""
	}
	return e.Path
}

// The raw rollout hands out the input's own text of each free-form value.
func TestRawRolloutViewsInput(t *testing.T) {
	doc := []byte(baseTop().set("messages", baseMessages(baseUser.set("content", `"h\u0069 \"x\""`), baseAsst.set("reasoning", `"r"`))).
		set("metadata", `{ "k" : [1, 2.50] }`).String())
	r, err := DecodeRawRollout(doc, DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(r.Messages[0].Content); got != `"h\u0069 \"x\""` {
		t.Errorf("content text %s", got)
	}
	if got := string(r.Messages[1].ToolCalls[0].Arguments); got != `{"user_id":"u1","n":2,"deep":[1,{"x":null}]}` {
		t.Errorf("arguments text %s", got)
	}
	if got := string(r.Metadata); got != `{ "k" : [1, 2.50] }` {
		t.Errorf("metadata text %s", got)
	}
	if r.Messages[1].Content != nil || string(r.Messages[1].Reasoning) != `"r"` {
		t.Errorf("null content %q, reasoning %q", r.Messages[1].Content, r.Messages[1].Reasoning)
	}
	if !strings.HasPrefix(string(r.Tools), "[") || !strings.HasPrefix(string(r.Grader), "{") || r.Head.RolloutID != "r1" {
		t.Errorf("tools %s grader %s head %+v", r.Tools, r.Grader, r.Head)
	}
}
