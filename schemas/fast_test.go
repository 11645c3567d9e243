package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ---- the oracle: the schema path, independent of fast.go ----

// schemaAccepts is the verdict of the JSON Schema path: encoding/json with
// UseNumber, the rollout schema, then the finite reward.
func schemaAccepts(data []byte) bool {
	doc, err := parseDoc(data)
	if err != nil {
		return false
	}
	if Validate(KindRollout, doc) != nil {
		return false
	}
	reward := doc.(map[string]any)["outcome"].(map[string]any)["reward"].(json.Number)
	_, err = strconv.ParseFloat(string(reward), 64) // ±Inf comes with ErrRange
	return err == nil
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
	doc, err := parseDoc(data)
	if err != nil {
		t.Fatal(err)
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
		"outcome", "messages", "tools", "grader", "metadata")
	for _, k := range []string{"start_time", "end_time"} {
		if s, ok := top[k].(string); ok {
			top[k] = upperTZ(s)
		}
	}
	top["agent"] = keep(top["agent"], "name", "version")
	top["outcome"] = keep(top["outcome"], "reward", "success")
	var msgs []any
	for _, m := range top["messages"].([]any) {
		mm := keep(m, "role", "content", "tool_calls", "tool_call_id", "error", "requestor", "turn_idx")
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
// form, so that rollouts compare by value. Decoded tools may be shared
// (SharedTools), so it rewrites a copy.
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

// checkContentPrefix: keeping only a content prefix (here at least 2 runes,
// 8 bytes) accepts exactly the same documents and decodes the same rollout,
// except that each content is a prefix of the whole one, complete or at
// least 8 bytes long.
func checkContentPrefix(t testing.TB, data []byte, full *Rollout) {
	t.Helper()
	p, why, _ := fastDecodeRolloutPrefix(data, DecodeOptions{ContentPrefix: 2}, nil)
	if (p != nil) != (full != nil) {
		t.Fatalf("with a content prefix the fast path accepts=%v (%s), without it %v\n%q", p != nil, why, full != nil, data)
	}
	if p == nil {
		return
	}
	for i := range full.Messages {
		c, w := p.Messages[i].Content, full.Messages[i].Content
		if !strings.HasPrefix(w, c) || (c != w && len(c) < 8) {
			t.Fatalf("message %d: prefix %q of %q", i, c, w)
		}
		p.Messages[i].Content = w
	}
	if !reflect.DeepEqual(p, full) {
		t.Fatalf("with a content prefix the rollout differs beyond the contents\n%q", data)
	}
}

// loneSurrogateEscape matches a \u escape of a surrogate, lone or not.
var loneSurrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

// cutRunes is TRACE's compaction rule (sink.Truncate) for n runes.
func cutRunes(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// checkRawJSON: with RawJSON (contents cut to cut characters) the fast path
// accepts exactly the same documents, every content, arguments and metadata
// text decodes to the value decoded without it (cut), and the rest of the
// rollout is the same. Values fall back to decoding only when the input escapes a
// surrogate (or for arguments, which may also repeat keys).
func checkRawJSON(t testing.TB, data []byte, full *Rollout, cut int) {
	t.Helper()
	p, why, _ := fastDecodeRolloutPrefix(data, DecodeOptions{ContentPrefix: cut + 1, RawJSON: true, ContentCut: cut}, nil)
	if (p != nil) != (full != nil) {
		t.Fatalf("with RawJSON the fast path accepts=%v (%s), without it %v\n%q", p != nil, why, full != nil, data)
	}
	if p == nil {
		return
	}
	for i := range full.Messages {
		m, w := &p.Messages[i], &full.Messages[i]
		switch {
		case m.ContentJSON != "":
			var c string
			if m.Content != "" || json.Unmarshal([]byte(`"`+m.ContentJSON+`"`), &c) != nil || c != cutRunes(w.Content, cut) {
				t.Fatalf("message %d: content text %q (%q) for %q\n%q", i, m.ContentJSON, m.Content, w.Content, data)
			}
		case m.Content == "":
			if w.Content != "" {
				t.Fatalf("message %d: content %q lost\n%q", i, w.Content, data)
			}
		case !loneSurrogateEscape.Match(data):
			t.Fatalf("message %d: content %q decoded, not kept as text\n%q", i, m.Content, data)
		case !strings.HasPrefix(w.Content, m.Content):
			t.Fatalf("message %d: content %q is not a prefix of %q", i, m.Content, w.Content)
		}
		m.Content, m.ContentJSON = w.Content, ""
		for j := range m.ToolCalls {
			tc := &m.ToolCalls[j]
			if tc.ArgumentsJSON != "" {
				var args map[string]any
				if tc.Arguments != nil || json.Unmarshal([]byte(tc.ArgumentsJSON), &args) != nil || !reflect.DeepEqual(args, w.ToolCalls[j].Arguments) {
					t.Fatalf("message %d call %d: arguments text %q for %v\n%q", i, j, tc.ArgumentsJSON, w.ToolCalls[j].Arguments, data)
				}
				tc.Arguments, tc.ArgumentsJSON = args, ""
			}
		}
	}
	if p.MetadataJSON != "" {
		var md map[string]any
		if p.Metadata != nil || json.Unmarshal([]byte(p.MetadataJSON), &md) != nil || !reflect.DeepEqual(md, full.Metadata) {
			t.Fatalf("metadata text %q for %v\n%q", p.MetadataJSON, full.Metadata, data)
		}
		p.Metadata, p.MetadataJSON = md, ""
	}
	if !reflect.DeepEqual(p, full) {
		t.Fatalf("with RawJSON the rollout differs beyond contents, arguments and metadata\n%q", data)
	}
}

// checkFast is the differential property: the fast path accepts exactly what
// the schema path accepts and the struct can hold, it decodes the value the
// schema's view describes, and DecodeRollout agrees with it.
func checkFast(t testing.TB, data []byte) {
	t.Helper()
	if precheck(data, DecodeOptions{}) != nil {
		return // size, emptiness and UTF-8 are checked before either path
	}
	got, why := fastDecodeRollout(data)
	checkContentPrefix(t, data, got)
	checkRawJSON(t, data, got, 3)
	checkRawJSON(t, data, got, 20) // long enough for bodyCut's 8-byte steps
	schemaOK := schemaAccepts(data)
	want := schemaOK && representable(data)
	if (got != nil) != want {
		t.Fatalf("fast path accepts=%v (%s), schema accepts=%v, representable=%v\n%q",
			got != nil, why, schemaOK, want || !schemaOK, data)
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
		return
	}
	exp := expectedRollout(t, data)
	canonicalParameters(t, got)
	canonicalParameters(t, r)
	if !reflect.DeepEqual(got, exp) {
		gb, _ := json.Marshal(got)
		eb, _ := json.Marshal(exp)
		t.Fatalf("fast path decoded\n%s\nwant\n%s\ninput %q", gb, eb, data)
	}
	if !reflect.DeepEqual(r, exp) {
		t.Fatalf("DecodeRollout differs from the fast path")
	}
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
	}
}

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
		for _, k := range []string{"role", "content", "tool_calls", "tool_call_id", "error", "requestor", "turn_idx"} {
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

func TestFastMatchesSchemaOnSeeds(t *testing.T) {
	docs := seedDocs()
	accepted := 0
	for _, d := range docs {
		checkFast(t, []byte(d))
		if r, _ := fastDecodeRollout([]byte(d)); r != nil {
			accepted++
		}
	}
	t.Logf("%d documents, %d accepted", len(docs), accepted)
	if accepted < 50 || accepted > len(docs)-50 {
		t.Fatalf("seeds are lopsided: %d of %d accepted", accepted, len(docs))
	}
}

// FuzzFastMatchesSchema: go test -fuzz=FuzzFastMatchesSchema ./schemas/
func FuzzFastMatchesSchema(f *testing.F) {
	for _, d := range seedDocs() {
		f.Add([]byte(d))
	}
	f.Add([]byte(validRollout))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		checkFast(t, data)
	})
}

// TestFastConstraints names the verdict of each constraint explicitly.
func TestFastConstraints(t *testing.T) {
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
		{"last duplicate wins (valid last)", top.set("rollout_id", `5`).add("rollout_id", `"r2"`), true},
		{"last duplicate wins (invalid last)", top.add("rollout_id", `""`), false},
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
		{"grader breakdown last duplicate wins", top.set("grader", `{"breakdown":{"a":"1","a":1}}`), true},
		{"metadata array", top.set("metadata", `[]`), false},
		{"metadata null", top.set("metadata", `null`), false},
		{"metadata anything inside", top.set("metadata", `{"a":[null,true,{"b":"c"}]}`), true},
		{"unknown members", top.add("extra", `{"x":[1,2,{"y":null}]}`), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := []byte(tt.doc.String())
			r, why := fastDecodeRollout(doc)
			if (r != nil) != tt.ok {
				t.Fatalf("fast path accepts=%v (%s), want %v\n%s", r != nil, why, tt.ok, doc)
			}
			checkFast(t, doc)
		})
	}
	for _, s := range []string{`[1,2]`, `"x"`, `{}`, `{"rollout_id":"r"`, baseTop().String() + "x"} {
		if r, _ := fastDecodeRollout([]byte(s)); r != nil {
			t.Errorf("accepted %q", s)
		}
	}
}

func TestFastDecodesValues(t *testing.T) {
	doc := baseTop().set("messages", baseMessages(
		baseUser.set("content", `"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00\ud800x"`).set("turn_idx", `1e1`),
		baseAsst, baseToolMsg.set("error", `true`))).String()
	r, why := fastDecodeRollout([]byte(doc))
	if r == nil {
		t.Fatal(why)
	}
	if got, want := r.Messages[0].Content, "a\"b\\c/d\b\f\n\r\té😀\ufffdx"; got != want {
		t.Errorf("content %q, want %q", got, want)
	}
	if *r.Messages[0].TurnIdx != 10 || !r.Messages[2].Error || r.Messages[1].Content != "" {
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
	checkFast(t, []byte(doc))
}

// TestFastErrorsComeFromTheSchema: a rejected message gets the schema
// library's error, as before the fast path existed.
func TestFastErrorsComeFromTheSchema(t *testing.T) {
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

// TestFastNeverKeepsInput: strings must not alias the caller's buffer, which
// the consumer reuses.
func TestFastNeverKeepsInput(t *testing.T) {
	doc := []byte(baseTop().String())
	r, why := fastDecodeRollout(doc)
	if r == nil {
		t.Fatal(why)
	}
	before := fmt.Sprintf("%+v", *r)
	for i := range doc {
		doc[i] = 'X'
	}
	if after := fmt.Sprintf("%+v", *r); after != before {
		t.Fatal("decoded rollout changed with its input buffer")
	}
}

// Tool arrays that decoded valid are remembered by their bytes: the same
// definitions give the same shared slice, equal to a fresh decode, even after
// the first input's buffer was overwritten; other definitions do not hit.
func TestToolsCache(t *testing.T) {
	tools := arr(baseTool.set("function", baseFunction.set("name", `"cache_probe_tool"`).String()).String())
	first := []byte(baseTop().set("tools", tools).String())
	a, why := fastDecodeRollout(first)
	if a == nil {
		t.Fatal(why)
	}
	want := slices.Clone(a.Tools)
	want[0].Function.Parameters = slices.Clone(want[0].Function.Parameters)
	for i := range first { // the consumer's buffers are not ours to keep
		first[i] = ' '
	}
	b, why := fastDecodeRollout([]byte(baseTop().set("rollout_id", `"other"`).set("tools", tools).String()))
	if b == nil {
		t.Fatal(why)
	}
	if !SharedTools(a.Tools) || !SharedTools(b.Tools) || &a.Tools[0] != &b.Tools[0] {
		t.Fatalf("same definitions: shared %v %v, same slice %v", SharedTools(a.Tools), SharedTools(b.Tools), &a.Tools[0] == &b.Tools[0])
	}
	if !reflect.DeepEqual(b.Tools, want) {
		t.Fatalf("cached tools %+v, want %+v", b.Tools, want)
	}
	other := arr(baseTool.set("function", baseFunction.set("name", `"cache_probe_other"`).String()).String())
	c, why := fastDecodeRollout([]byte(baseTop().set("tools", other).String()))
	if c == nil {
		t.Fatal(why)
	}
	if &c.Tools[0] == &a.Tools[0] || c.Tools[0].Function.Name != "cache_probe_other" {
		t.Fatalf("different definitions hit the cache: %+v", c.Tools)
	}
	if SharedTools([]Tool{{Type: "function"}}) {
		t.Fatal("a tool slice built by hand reported shared")
	}
}

// RawJSON hands contents and arguments over as their text from the input,
// cut or whole, and falls back to decoding exactly where the text would be
// ambiguous.
func TestRawJSON(t *testing.T) {
	opt := DecodeOptions{ContentPrefix: 4, RawJSON: true, ContentCut: 3}
	decode := func(content, args string) []Message {
		t.Helper()
		call := baseCall.set("arguments", args)
		doc := baseTop().set("messages", baseMessages(baseUser.set("content", content), baseAsst.set("tool_calls", arr(call.String()))))
		r, err := DecodeRolloutInto([]byte(doc.String()), opt, nil)
		if err != nil {
			t.Fatalf("%s / %s: %v", content, args, err)
		}
		return r.Messages
	}
	contents := []struct{ in, text, decoded string }{
		{`""`, ``, ``},
		{`"abc"`, `abc`, ``},
		{`"abcd"`, `ab…`, ``},
		{`"ab\n"`, `ab\n`, ``},
		{`"ab\ncd"`, `ab…`, ``},
		{`"a\"\\/x"`, `a\"…`, ``},
		{`"\u00e9\u00e9\u00e9\u00e9"`, `\u00e9\u00e9…`, ``},
		{`"é😀xy"`, `é😀…`, ``},
		{`"\ud83d\ude00xyz"`, `\ud83d\ude00x…`, ``},
		{`"abcd\ud800"`, `ab…`, ``},                // the lone surrogate is past the cut
		{`"abc\ud800"`, `ab…`, ``},                 // character 4: past the cut too
		{`"ab\ud800"`, ``, "ab\ufffd"},             // character 3, kept: decoded
		{`"\ud800abc"`, ``, "\ufffdabc"},           // in the part kept: decoded
		{`"ab\udc00"`, ``, "ab\ufffd"},             // a low surrogate alone
		{`"x\ud83dy"`, ``, "x\ufffdy"},             // a high surrogate alone
		{q(strings.Repeat("é", 50)), `éé…`, ``},    // cut inside a long run
		{q(strings.Repeat("a\"", 50)), `a\"…`, ``}, // cut between escapes
	}
	for _, c := range contents {
		m := decode(c.in, `{}`)[0]
		if m.ContentJSON != c.text || m.Content != c.decoded {
			t.Errorf("content %s: text %q decoded %q, want %q %q", c.in, m.ContentJSON, m.Content, c.text, c.decoded)
		}
	}
	many := func(n int) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"k%d":%d`, i, i)
		}
		return b.String() + "}"
	}
	for _, c := range []struct {
		args string
		raw  bool
	}{
		{`{"user_id":"u1","n":2,"deep":[1,{"x":null}]}`, true},
		{"{ \"a\" : [ 1 , 2.50 ] ,\n \"b\" : \"<&>\" }", true},
		{`{"a":"\ud83d\ude00","b":"\u00e9"}`, true},
		{`{"a":{"b":1},"c":{"b":2}}`, true}, // the same key in two objects
		{many(32), true},
		{many(33), false},
		{`{"a":1,"a":2}`, false},
		{`{"a":{"b":1,"b":2}}`, false},
		{`{"a":[{"b":1,"b":2}]}`, false},
		{`{"\u0061":1}`, false},
		{`{"a":"\ud800"}`, false},
		{`{"a":["x\udfff"]}`, false},
	} {
		tc := decode(`"hi"`, c.args)[1].ToolCalls[0]
		var want map[string]any
		if err := json.Unmarshal([]byte(c.args), &want); err != nil {
			t.Fatal(err)
		}
		switch {
		case c.raw && (tc.ArgumentsJSON != c.args || tc.Arguments != nil):
			t.Errorf("arguments %s: text %q, decoded %v; want the text", c.args, tc.ArgumentsJSON, tc.Arguments)
		case !c.raw && (tc.ArgumentsJSON != "" || !reflect.DeepEqual(tc.Arguments, want)):
			t.Errorf("arguments %s: text %q, decoded %v; want decoded %v", c.args, tc.ArgumentsJSON, tc.Arguments, want)
		}
	}
}

func TestRawJSONMetadata(t *testing.T) {
	opt := DecodeOptions{RawJSON: true}
	for _, c := range []struct {
		md  string
		raw bool
	}{{`{"k": [1, "v"]}`, true}, {`{}`, true}, {`{"k":1,"k":2}`, false}, {`{"k":"\udfff"}`, false}} {
		r, err := DecodeRolloutInto([]byte(baseTop().set("metadata", c.md).String()), opt, nil)
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		_ = json.Unmarshal([]byte(c.md), &want)
		if c.raw && (r.MetadataJSON != c.md || r.Metadata != nil) || !c.raw && (r.MetadataJSON != "" || !reflect.DeepEqual(r.Metadata, want)) {
			t.Errorf("metadata %s: text %q decoded %v, want the text: %v", c.md, r.MetadataJSON, r.Metadata, c.raw)
		}
	}
}

// plainRun stops at the first quote, backslash or control character at every
// offset and alignment.
func TestPlainRun(t *testing.T) {
	for _, special := range []byte{'"', '\\', 0, 0x1f, '\n'} {
		for n := 0; n < 80; n++ {
			for at := 0; at <= n; at++ {
				b := bytes.Repeat([]byte("aé~\x7f"), 20)[:n+1]
				b[len(b)-1] = 'z'
				if at < n {
					b[at] = special
				}
				for i := 0; i <= min(at, 3); i++ {
					if got, want := plainRun(b, i), plainRunRef(b, i); got != want {
						t.Fatalf("plainRun(%q, %d) = %d, want %d", b, i, got, want)
					}
				}
			}
		}
	}
}

func plainRunRef(b []byte, i int) int {
	for i < len(b) && b[i] >= 0x20 && b[i] != '"' && b[i] != '\\' {
		i++
	}
	return i
}

// FuzzPlainRun: go test -fuzz=FuzzPlainRun ./schemas/
func FuzzPlainRun(f *testing.F) {
	f.Add([]byte(strings.Repeat("x", 40)+`"`), 3)
	f.Add([]byte(strings.Repeat("é\x1f", 30)), 0)
	f.Fuzz(func(t *testing.T, b []byte, i int) {
		if i < 0 || i > len(b) {
			return
		}
		if got, want := plainRun(b, i), plainRunRef(b, i); got != want {
			t.Fatalf("plainRun(%q, %d) = %d, want %d", b, i, got, want)
		}
	})
}

// escapedMask marks exactly the bytes that an odd run of backslashes ends
// before, across block boundaries.
func TestEscapedMask(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		n := 64 * (1 + rng.IntN(3))
		b := make([]byte, n)
		for i := range b {
			if rng.IntN(3) == 0 {
				b[i] = 'a'
			} else {
				b[i] = '\\'
			}
		}
		var carry uint64
		escaped := false
		for blk := 0; blk < n; blk += 64 {
			var bs, want uint64
			for i := range 64 {
				c := b[blk+i]
				if c == '\\' {
					bs |= 1 << i
				}
				if escaped {
					want |= 1 << i
					escaped = false
				} else if c == '\\' {
					escaped = true
				}
			}
			if got := escapedMask(bs, &carry); got != want {
				t.Fatalf("block %d of %q: %064b, want %064b", blk/64, b, got, want)
			}
		}
	}
}

// skipStrFrom (64 bytes at a time when it can) agrees with a byte-at-a-time
// reader on where a string ends, whether it is valid and whether it escapes
// a lone surrogate, for strings of escapes, quotes, control characters and
// multi-byte characters at every alignment.
func TestSkipStr(t *testing.T) {
	pieces := []string{"a", "bcdefgh", "é", "😀", `\"`, `\\`, `\/`, `\n`, `\u00e9`, `\ud83d\ude00`, `\ud800`, `\udc00x`,
		`\\\"`, `\\\\`, `"`, "\x01", `\x`, `\u12g4`, `\`, `\u`, strings.Repeat("p", 60)}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 30000 {
		var sb strings.Builder
		sb.WriteString(strings.Repeat(" ", rng.IntN(70)))
		start := sb.Len()
		for sb.Len() < start+rng.IntN(300) {
			p := pieces[rng.IntN(len(pieces))]
			if (p == `"` || p == "\x01" || p == `\x` || p == `\u12g4` || p == `\` || p == `\u`) && rng.IntN(8) != 0 {
				continue // keep most strings long and valid
			}
			sb.WriteString(p)
		}
		sb.WriteString(`"` + strings.Repeat("z", rng.IntN(70)))
		b := []byte(sb.String())
		end, noLone, ok := skipStrRef(b, start)
		d := fastDec{b: b}
		gotOK, gotNoLone := true, false
		func() {
			defer func() {
				if p := recover(); p != nil {
					if _, isReject := p.(fastReject); !isReject {
						panic(p)
					}
					gotOK = false
				}
			}()
			gotNoLone = d.skipStrFrom(start)
		}()
		if gotOK != ok || ok && (d.i != end || gotNoLone != noLone) {
			t.Fatalf("%q from %d: ok=%v end=%d noLone=%v, want %v %d %v", b, start, gotOK, d.i, gotNoLone, ok, end, noLone)
		}
	}
}

// skipStrRef is skipStrFrom one byte at a time.
func skipStrRef(b []byte, j int) (end int, noLone, ok bool) {
	noLone = true
	for j < len(b) {
		switch c := b[j]; {
		case c == '"':
			return j + 1, noLone, true
		case c == '\\':
			next, lone := escapeEnd(b, j)
			if next < 0 {
				return 0, false, false
			}
			noLone = noLone && !lone
			j = next
		case c < 0x20:
			return 0, false, false
		default:
			j++
		}
	}
	return 0, false, false
}

// bodyCut agrees with decoding the body and counting its characters, on
// random bodies of ASCII runs, multi-byte characters and escapes, for cuts
// short and long (the 8-byte steps only run for long ones).
func TestBodyCut(t *testing.T) {
	pieces := []string{"a", "bcdefgh", "ijklmnopqrstuvw", "é", "’", "😀", `\"`, `\\`, `\/`, `\n`, `\u00e9`, `\ud83d\ude00`, `\ud800`, `\udc00`}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 40000 {
		var sb strings.Builder
		for sb.Len() < rng.IntN(120) {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		body := sb.String()
		var s string
		if err := json.Unmarshal([]byte(`"`+body+`"`), &s); err != nil {
			t.Fatal(err)
		}
		// The characters of the body: its escapes decode one by one, a
		// surrogate pair to one character.
		chars := []rune(s)
		for _, n := range []int{1, 2, 3, 8, 9, 17, 30, 60} {
			cut, over, lone := bodyCut([]byte(body), n)
			if over != (len(chars) > n) {
				t.Fatalf("bodyCut(%q, %d): over=%v, %d characters", body, n, over, len(chars))
			}
			if !over {
				continue
			}
			var kept string
			if err := json.Unmarshal([]byte(`"`+body[:cut]+`"`), &kept); err != nil || kept != string(chars[:n-1]) {
				t.Fatalf("bodyCut(%q, %d): cut %d keeps %q, want %q", body, n, cut, kept, string(chars[:n-1]))
			}
			first := loneIn(body, n)
			if lone != first {
				t.Fatalf("bodyCut(%q, %d): lone=%v, want %v", body, n, lone, first)
			}
		}
	}
}

// loneIn reports whether one of the first n characters of a body escapes a
// lone surrogate.
func loneIn(body string, n int) bool {
	b := []byte(body)
	for i, count := 0, 0; i < len(b) && count < n; count++ {
		if b[i] != '\\' {
			_, size := utf8.DecodeRune(b[i:])
			i += size
			continue
		}
		next, lone := escapeEnd(b, i)
		if lone {
			return true
		}
		i = next
	}
	return false
}

// A bug of the fast path (here a stand-in panic) does not refuse a valid
// rollout: encoding/json decodes it, and the fallback is counted. An invalid
// rollout is still refused with the schema's reason.
func TestFastPathBugFallsBack(t *testing.T) {
	want, err := DecodeRollout([]byte(validRollout), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fastTestHook = func() { _ = []int{}[len(validRollout)] }
	defer func() { fastTestHook = nil }()
	before := FastPathFallbacks()
	got, err := DecodeRolloutInto([]byte(validRollout), DecodeOptions{RawJSON: true, ContentCut: 3}, nil)
	if err != nil {
		t.Fatalf("a fast-path bug refused a valid rollout: %v", err)
	}
	canonicalParameters(t, got)
	canonicalParameters(t, want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("fallback decoded %+v, want %+v", got, want)
	}
	if n := FastPathFallbacks() - before; n != 1 {
		t.Fatalf("%d fallbacks counted, want 1", n)
	}
	var e *Error
	if _, err := DecodeRollout([]byte(`{"rollout_id":1}`), DecodeOptions{}); !errors.As(err, &e) || e.Reason != ReasonSchema {
		t.Fatalf("invalid rollout: %v", err)
	}
	if n := FastPathFallbacks() - before; n != 1 {
		t.Fatalf("an invalid rollout was counted as a fallback")
	}
}
