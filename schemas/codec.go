package schemas

// The rollout codec: raw rollouts, their decoding into Go values, and the
// strict syntax check that names a rejection
// (github.com/go-json-experiment/json/jsontext).
//
// A parser (scanRollout in scan.go, which DecodeRawRollout uses, and
// parseJSONText on jsontext in codec_jsontext_test.go, the reference it is
// tested against) reads a rollout and
// checks, while it goes, exactly the constraints of rollout.v1.schema.json
// plus what the Go types need (a finite reward, a turn_idx within an int,
// numbers within a float64 in arguments, metadata and breakdown, times that
// time.Time parses). It accepts a document only when the schema path
// (explainRollout: strict syntax, then encoding/json with UseNumber and
// santhosh-tekuri/jsonschema, then the finite reward) would accept it;
// anything else makes it answer "not accepted" and DecodeRawRollout runs the
// schema path to name the precise error. FuzzParserMatchesSchema checks the
// equivalence both ways, for both parsers.
//
// The syntax is RFC 8259 with RFC 7493's restrictions, as jsontext reads it:
// a repeated member name (compared after unescaping, at any depth), an
// escaped lone surrogate and invalid UTF-8 are errors; nesting is limited to
// 10,000 levels like encoding/json's. Keys match exactly (case-sensitive);
// unknown keys are allowed and skipped (their syntax checked). Lengths count
// runes; "integer" accepts any integral number (1.0, 1e2); times must pass
// the schema library's date-time check and time.Time's RFC 3339 parser.
//
// Free-form values are not decoded: a parser hands out their text from the
// input (jsontext.Value, RawRollout), which RawRollout.Decode turns into Go
// values with encoding/json/v2's semantics (github.com/go-json-experiment/json).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// RawRollout is a rollout checked against rollout.v1 whose free-form values
// are kept as their JSON text. Every jsontext.Value views the decoded input
// and is valid while that input is not modified; the strings are copies.
type RawRollout struct {
	// Head holds every field of the rollout but Messages, Tools, Grader and
	// Metadata, which stay empty in it.
	Head     Rollout
	Messages []RawMessage
	Tools    jsontext.Value // the tools array, nil when absent
	Grader   jsontext.Value // the grader object, nil when absent
	Metadata jsontext.Value // the metadata object, nil when absent
}

// RawMessage is a Message whose strings (but the role and requestor) are
// JSON text: a JSON string, or nil when absent (or null).
type RawMessage struct {
	Role       string
	Content    jsontext.Value
	Reasoning  jsontext.Value
	ToolCalls  []RawToolCall
	ToolCallID jsontext.Value
	Error      bool
	ErrorText  jsontext.Value
	Requestor  string
	TurnIdx    *int
}

// RawToolCall is a ToolCall whose id and name (JSON strings) and arguments
// (a JSON object) are JSON text.
type RawToolCall struct {
	ID, Name  jsontext.Value
	Arguments jsontext.Value
	Requestor string
}

// Decode turns the raw rollout into a Rollout, decoding its free-form values.
func (r *RawRollout) Decode() (*Rollout, error) {
	out := r.Head
	out.Messages = make([]Message, len(r.Messages))
	for i := range r.Messages {
		m := &r.Messages[i]
		om := Message{Role: m.Role, Content: UnquoteString(m.Content), Reasoning: UnquoteString(m.Reasoning),
			ToolCallID: UnquoteString(m.ToolCallID), Error: m.Error, ErrorText: UnquoteString(m.ErrorText), Requestor: m.Requestor, TurnIdx: m.TurnIdx}
		if m.ToolCalls != nil {
			om.ToolCalls = make([]ToolCall, len(m.ToolCalls))
			for j, tc := range m.ToolCalls {
				om.ToolCalls[j] = ToolCall{ID: UnquoteString(tc.ID), Name: UnquoteString(tc.Name), Requestor: tc.Requestor}
				if err := jsonv2.Unmarshal(tc.Arguments, &om.ToolCalls[j].Arguments); err != nil {
					return nil, &Error{Reason: ReasonSchema, Path: fmt.Sprintf("/messages/%d/tool_calls/%d/arguments", i, j), Msg: err.Error()}
				}
			}
		}
		out.Messages[i] = om
	}
	for _, v := range []struct {
		raw  jsontext.Value
		into any
		path string
	}{{r.Tools, &out.Tools, "/tools"}, {r.Grader, &out.Grader, "/grader"}, {r.Metadata, &out.Metadata, "/metadata"}} {
		if v.raw == nil {
			continue
		}
		if err := jsonv2.Unmarshal(v.raw, v.into); err != nil {
			return nil, &Error{Reason: ReasonSchema, Path: v.path, Msg: err.Error()}
		}
	}
	return &out, nil
}

// UnquoteString returns the string a valid JSON string's text stands for
// ("" for nil).
func UnquoteString(v jsontext.Value) string {
	if len(v) < 2 {
		return ""
	}
	if body := v[1 : len(v)-1]; bytes.IndexByte(body, '\\') < 0 {
		return string(body)
	}
	b, _ := jsontext.AppendUnquote(nil, v)
	return string(b)
}

// checkSyntax reports the first strict-syntax error of valid UTF-8: a
// document that is not JSON, even when it also repeats a name, is
// ReasonNotJSON (as is a lone surrogate escape); a repeated member name is
// ReasonDuplicateKey with the JSON pointer of the first repeat.
func checkSyntax(data []byte) error {
	for _, strict := range []bool{false, true} {
		p := getParser(data, jsontext.AllowDuplicateNames(!strict))
		err := p.dec.SkipValue()
		if err == nil {
			if _, err = p.dec.ReadToken(); err == io.EOF {
				err = nil
			} else if err == nil {
				err = errors.New("trailing data after the JSON value")
			}
		}
		putParser(p)
		if err == nil {
			continue
		}
		var se *jsontext.SyntacticError
		if strict && errors.As(err, &se) && errors.Is(se.Err, jsontext.ErrDuplicateName) {
			return &Error{Reason: ReasonDuplicateKey, Path: clip(string(se.JSONPointer)), Msg: clip(err.Error())}
		}
		return &Error{Reason: ReasonNotJSON, Msg: clip(err.Error())}
	}
	return nil
}

// clip bounds an error text (a JSON pointer can be as long as the input).
func clip(s string) string {
	const n = 512
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// parser reads one document from a byte slice without copying it
// (jsontext reads a bytes.Buffer in place).
type parser struct {
	src  bytes.Buffer
	dec  jsontext.Decoder
	data []byte
	why  string // why the document was not accepted
	name []byte // scratch: an unescaped member name
}

var parsers = sync.Pool{New: func() any { return new(parser) }}

func getParser(data []byte, opts ...jsontext.Options) *parser {
	p := parsers.Get().(*parser)
	p.src = *bytes.NewBuffer(data)
	p.dec.Reset(&p.src, opts...)
	p.data, p.why = data, ""
	return p
}

func putParser(p *parser) {
	p.src = bytes.Buffer{}
	p.dec.Reset(&p.src) // drop the reference to the input
	p.data = nil
	parsers.Put(p)
}

// A rolloutParser reads a rollout into its raw form, checking rollout.v1
// and what the Go types can hold; it returns nil and why when it does not
// accept the document. The two implementations accept the same documents
// with the same values (FuzzParserMatchesSchema): scanRollout (scan.go),
// hand-written, which DecodeRawRollout uses because it costs less CPU per
// rollout, and parseJSONText (codec_jsontext_test.go), on jsontext
// (docs/ARCHITECTURE.md, "The rollout codec", has the measurements).
type rolloutParser func(data []byte) (*RawRollout, string)

var parseRollout rolloutParser = scanRollout

// Field bits of the top-level object.
const (
	fRolloutID = 1 << iota
	fEnvironment
	fAgent
	fTaskID
	fOutcome
	fMessages

	fRequired = fRolloutID | fEnvironment | fAgent | fTaskID | fOutcome | fMessages
)

// lenOK checks minLength/maxLength in runes (max < 0: no maximum).
func lenOK(s string, minRunes, maxRunes int) bool {
	if len(s) < minRunes {
		return false // fewer bytes than runes needed
	}
	if maxRunes >= 0 && len(s) > maxRunes {
		n := utf8.RuneCountInString(s)
		return n >= minRunes && n <= maxRunes
	}
	return minRunes <= 1 || utf8.RuneCountInString(s) >= minRunes
}

// parseIntegral reports whether a valid JSON number token is an integer the
// way the schema library decides it (math/big.Rat's SetString then IsInt,
// which refuses an exponent that overflows an int64 and, for a non-zero
// mantissa, |exponent - fraction digits| > 1e6), and, when it fits an int64,
// its value.
func parseIntegral(tok string) (v int, integral, fits bool) {
	neg := tok[0] == '-'
	if neg {
		tok = tok[1:]
	}
	mant := tok
	var e int64
	if k := strings.IndexAny(tok, "eE"); k >= 0 {
		mant = tok[:k]
		x, err := strconv.ParseInt(tok[k+1:], 10, 64)
		if err != nil {
			return 0, false, false
		}
		e = x
	}
	intPart, frac := mant, ""
	if k := strings.IndexByte(mant, '.'); k >= 0 {
		intPart, frac = mant[:k], mant[k+1:]
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return 0, true, true // zero, whatever the exponent
	}
	if e < math.MinInt64+int64(len(frac)) {
		return 0, false, false
	}
	exp5 := e - int64(len(frac)) // value = (intPart frac) × 10^exp5
	if exp5 > 1e6 || exp5 < -1e6 {
		return 0, false, false // big.Rat refuses such exponents
	}
	trimmed := strings.TrimRight(digits, "0")
	exp5 += int64(len(digits) - len(trimmed))
	digits = trimmed
	if exp5 < 0 {
		return 0, false, false // a non-zero fractional part remains
	}
	if int64(len(digits))+exp5 > 19 {
		return 0, true, false
	}
	u, err := strconv.ParseUint(digits+strings.Repeat("0", int(exp5)), 10, 64)
	if err != nil {
		return 0, true, false
	}
	if neg {
		if u > 1<<63 {
			return 0, true, false
		}
		return int(-int64(u)), true, true // -(1<<63) wraps to itself
	}
	if u > math.MaxInt64 {
		return 0, true, false
	}
	return int(u), true, true
}

// parseDateTime parses a string that passed validDateTime with time.Time's
// RFC 3339 parser, after upper-casing the 't' and 'z' that RFC 3339 allows
// in lower case and the parser does not.
func parseDateTime(s string) (time.Time, error) {
	b := []byte(s)
	if b[10] == 't' {
		b[10] = 'T'
	}
	if b[len(b)-1] == 'z' {
		b[len(b)-1] = 'Z'
	}
	var t time.Time
	err := t.UnmarshalText(b)
	return t, err
}

// validEnvironment: minLength 1, maxLength 128, ^[A-Za-z0-9][A-Za-z0-9_.:-]*$
// (ASCII only, so bytes are runes).
func validEnvironment(s string) bool {
	if len(s) == 0 || len(s) > 128 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '_' && c != '.' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

// validDateTime is the date-time check of the schema library
// (santhosh-tekuri/jsonschema/v6 format.go, validateDateTime), reproduced
// here because it is not exported: RFC 3339 date-time, 't'/'T' separator,
// 'z'/'Z' or a ±hh:mm offset, and leap seconds only at 23:59:60 UTC.
func validDateTime(s string) bool {
	if len(s) < 20 {
		return false
	}
	if s[10] != 't' && s[10] != 'T' {
		return false
	}
	if _, err := time.Parse("2006-01-02", s[:10]); err != nil {
		return false
	}
	return validTime(s[11:])
}

func validTime(str string) bool {
	if len(str) < 9 {
		return false
	}
	if str[2] != ':' || str[5] != ':' {
		return false
	}
	var hms [3]int
	for i, tok := range strings.SplitN(str[:8], ":", 3) {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 {
			return false
		}
		hms[i] = n
	}
	h, m, s := hms[0], hms[1], hms[2]
	if h > 23 || m > 59 || s > 60 {
		return false
	}
	str = str[8:]
	if rem, ok := strings.CutPrefix(str, "."); ok {
		numDigits := 0
		for _, ch := range rem {
			if ch >= '0' && ch <= '9' {
				numDigits++
			} else {
				break
			}
		}
		if numDigits == 0 {
			return false
		}
		str = rem[numDigits:]
	}
	if str != "z" && str != "Z" {
		if len(str) != 6 {
			return false
		}
		var sign int
		switch str[0] {
		case '+':
			sign = -1
		case '-':
			sign = +1
		default:
			return false
		}
		str = str[1:]
		if str[2] != ':' {
			return false
		}
		var zhm [2]int
		for i, tok := range strings.SplitN(str, ":", 2) {
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 {
				return false
			}
			zhm[i] = n
		}
		zh, zm := zhm[0], zhm[1]
		if zh > 23 || zm > 59 {
			return false
		}
		hm := (h*60 + m) + sign*(zh*60+zm)
		if hm < 0 {
			hm += 24 * 60
		}
		h, m = hm/60, hm%60
	}
	if s >= 60 && (h != 23 || m != 59) {
		return false
	}
	return true
}
