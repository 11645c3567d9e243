package schemas

// The fast path of DecodeRollout.
//
// fastDecodeRollout parses a rollout in one pass straight into the Go struct
// and checks, while it goes, exactly the constraints of rollout.v1.schema.json
// plus the finite-reward check. It accepts a document only when the JSON
// Schema path (encoding/json with UseNumber, then santhosh-tekuri/jsonschema,
// then the finite reward) would accept it and the struct can hold every value;
// anything else makes it answer "not accepted", and DecodeRollout then runs
// the schema path to name the precise error. FuzzFastMatchesSchema checks the
// equivalence in both directions.
//
// Why a purpose-built parser and not a general JSON library decoding into the
// struct: a struct decoder loses what the schema looks at. encoding/json-style
// decoders (goccy/go-json, sonic, segmentio) match keys case-insensitively
// ("Rollout_ID" fills RolloutID, while for the schema it is an unknown key),
// merge duplicate keys into the value decoded before (the schema sees the
// last value only), take null for "absent" in every field, and parse
// times with time.Time's own rules instead of the schema's date-time checker.
// Recovering that would need a second structural pass over the bytes, which
// costs as much as parsing. Parsing with the schema in hand does both at once,
// and measured faster than the fastest library's struct decode alone.
//
// Semantics that mirror the schema path exactly:
//   - JSON syntax is RFC 8259 as encoding/json's scanner reads it (numbers,
//     escapes, control characters, nothing but whitespace after the value).
//     Strings are unescaped like encoding/json (an invalid surrogate escape
//     becomes U+FFFD). UTF-8 validity is checked before, by DecodeRollout.
//   - Keys match exactly (case-sensitive), unknown keys are allowed and
//     skipped (after a syntax check), and for a repeated key the last value
//     wins: it alone is validated and decoded, as in the map the schema sees.
//   - Lengths count runes; "integer" accepts any integral number (1.0, 1e2),
//     which must also fit an int; "number" must be finite as a float64 to be
//     stored (reward, breakdown, numbers in arguments and metadata), like
//     json.Unmarshal requires; times must pass the date-time format check AND
//     time.Time's RFC 3339 parser (leap seconds pass the first, not the
//     second; a lower-case 't' or 'z' is upper-cased for the second).
//   - A value the struct cannot hold (a turn_idx beyond an int, a number
//     beyond a float64 in arguments, metadata or breakdown, a time that
//     time.Time refuses) is refused wherever it occurs at a position the
//     schema types, even when a later duplicate key replaces it, as
//     json.Unmarshal would. DecodeRollout reports it as a schema error.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// fastMaxDepth is encoding/json's nesting limit: a document nested deeper is
// not JSON for the schema path either.
const fastMaxDepth = 10000

// fastReject is the panic value that aborts the fast path: the document is
// not accepted (bad syntax, too deep, or a value the struct cannot hold).
type fastReject struct{ why string }

// fastBug starts why when the fast path failed by a bug of its own (a
// panic other than fastReject), not because of the document.
const fastBug = "fast path bug: "

// fastTestHook, set by tests only, runs at the start of the fast path (to
// stand for a bug in it).
var fastTestHook func()

// fastDecodeRollout is the fast path. It returns the rollout, or nil and why
// it was not accepted. It never panics to its caller.
func fastDecodeRollout(data []byte) (r *Rollout, why string) {
	r, why, _ = fastDecodeRolloutPrefix(data, DecodeOptions{}, nil)
	return r, why
}

// fastDecodeRolloutPrefix is fastDecodeRollout with opt's ContentPrefix,
// RawJSON and ContentCut, with its strings in arena when that has room for
// them (else in a new buffer). It returns the buffer the strings are in.
func fastDecodeRolloutPrefix(data []byte, opt DecodeOptions, arena []byte) (r *Rollout, why string, used []byte) {
	if cap(arena) < len(data) {
		arena = make([]byte, 0, len(data))
	}
	d := fastDec{b: data, arena: arena[:0]}
	defer func() { used = d.arena }()
	if opt.ContentPrefix > 0 {
		d.contentCap = utf8.UTFMax * opt.ContentPrefix // bytes that hold at least ContentPrefix runes
	}
	d.raw, d.rawCut = opt.RawJSON, opt.ContentCut
	defer func() {
		if p := recover(); p != nil {
			r, why = nil, fmt.Sprint(fastBug, p)
			if fr, ok := p.(fastReject); ok {
				why = fr.why
			}
			// Any other panic would be a bug here: the schema path decides
			// (and DecodeRolloutInto falls back to encoding/json).
		}
	}()
	if fastTestHook != nil {
		fastTestHook()
	}
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != '{' {
		return nil, "top level is not an object", d.arena
	}
	r = new(Rollout)
	if !d.rollout(r) {
		return nil, d.invalidWhy(), d.arena
	}
	d.ws()
	if d.i != len(d.b) {
		return nil, "trailing data after the JSON value", d.arena
	}
	return r, "", d.arena
}

type fastDec struct {
	b     []byte
	i     int
	depth int
	// arena holds the unescaped bytes of every string of the document. Its
	// capacity is len(b) and an unescaped string is never longer than its
	// quoted form, so it never reallocates: strings handed out are views of
	// bytes that are written once and never changed.
	arena []byte
	why   string // first schema violation seen (diagnostics only)
	// contentCap > 0: message contents are kept up to about this many
	// bytes (strCapped).
	contentCap int
	// raw: message contents and tool-call arguments are kept as JSON text
	// (rawStr, rawObject), contents cut to rawCut characters when that is
	// > 0: DecodeOptions.RawJSON and ContentCut.
	raw    bool
	rawCut int
}

func (d *fastDec) reject(why string) { panic(fastReject{why: why}) }

func (d *fastDec) syntax() { d.reject("JSON syntax error at byte " + strconv.Itoa(d.i)) }

// invalid records a schema violation (the document is then not accepted, but
// parsing goes on: a later duplicate key may replace the offending value).
func (d *fastDec) invalid(what string) bool {
	if d.why == "" {
		d.why = what
	}
	return false
}

func (d *fastDec) invalidWhy() string {
	if d.why == "" {
		return "schema violation"
	}
	return "schema violation: " + d.why
}

// ---- tokens ----

func (d *fastDec) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte (syntax error at EOF).
func (d *fastDec) peek() byte {
	d.ws()
	if d.i >= len(d.b) {
		d.syntax()
	}
	return d.b[d.i]
}

func (d *fastDec) expect(c byte) {
	if d.peek() != c {
		d.syntax()
	}
	d.i++
}

// strPlain[c] is true for the bytes a string holds as they are.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plainRun returns the index of the first byte at or after i that ends a
// run of plain string bytes (a quote, a backslash or a control character),
// or len(b). It tests 8 bytes at a time. (Long strings are validated 64
// bytes at a time by skipStrFrom.)
func plainRun(b []byte, i int) int {
	for i+8 <= len(b) {
		if m := runEnd8(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(b) && strPlain[b[i]] {
		i++
	}
	return i
}

// runEnd8 marks (high bit) the bytes of 8 string bytes that end a plain run:
// a byte < 0x20 (bytes >= 0x80 excluded by &^x), or a zero byte after XOR
// with '"' or '\\'. The lowest mark is exact (borrows only mark bytes above
// a true one): it is where the run ends.
func runEnd8(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	lt := (x - ones*0x20) &^ x
	q := x ^ (ones * '"')
	bs := x ^ (ones * '\\')
	return (lt | ((q - ones) &^ q) | ((bs - ones) &^ bs)) & highs
}

// str reads a string (d.b[d.i] must be '"') and returns it unescaped, as a
// view of the arena.
func (d *fastDec) str() string { return d.strCapped(0) }

// strCapped is str, except that once capBytes (> 0; 0 is no limit) bytes of
// the string are unescaped it stops copying and only validates the rest
// (same checks as skip). The result is then a prefix of the string, cut at a
// byte boundary (possibly inside a character) after at least capBytes bytes.
func (d *fastDec) strCapped(capBytes int) string {
	b := d.b
	i := d.i + 1
	start := len(d.arena)
	for {
		j := plainRun(b, i)
		if kept := len(d.arena) - start; capBytes > 0 && kept+(j-i) > capBytes {
			d.arena = append(d.arena, b[i:i+max(0, capBytes-kept)]...)
			d.skipStrFrom(j)
			return unsafe.String(&d.arena[start], len(d.arena)-start)
		}
		d.arena = append(d.arena, b[i:j]...)
		if j >= len(b) {
			d.i = j
			d.syntax()
		}
		switch c := b[j]; {
		case c == '"':
			d.i = j + 1
			n := len(d.arena) - start
			if n == 0 {
				return ""
			}
			return unsafe.String(&d.arena[start], n)
		case c == '\\':
			i = d.escape(j)
		default: // control character
			d.i = j
			d.syntax()
		}
	}
}

// escape decodes the escape at b[j] == '\\' into the arena, like
// encoding/json's unquote, and returns the index after it.
func (d *fastDec) escape(j int) int {
	b := d.b
	if j+1 >= len(b) {
		d.i = j
		d.syntax()
	}
	switch b[j+1] {
	case '"', '\\', '/':
		d.arena = append(d.arena, b[j+1])
	case 'b':
		d.arena = append(d.arena, '\b')
	case 'f':
		d.arena = append(d.arena, '\f')
	case 'n':
		d.arena = append(d.arena, '\n')
	case 'r':
		d.arena = append(d.arena, '\r')
	case 't':
		d.arena = append(d.arena, '\t')
	case 'u':
		rr := hex4(b, j+2)
		if rr < 0 {
			d.i = j
			d.syntax()
		}
		j += 6
		if utf16.IsSurrogate(rr) {
			// A valid pair is consumed whole; anything else makes this
			// escape U+FFFD and leaves what follows to be read on its own.
			if j+1 < len(b) && b[j] == '\\' && b[j+1] == 'u' {
				if rr1 := hex4(b, j+2); rr1 >= 0 {
					if dec := utf16.DecodeRune(rr, rr1); dec != utf8.RuneError {
						d.arena = utf8.AppendRune(d.arena, dec)
						return j + 6
					}
				}
			}
			rr = utf8.RuneError
		}
		d.arena = utf8.AppendRune(d.arena, rr)
		return j
	default:
		d.i = j
		d.syntax()
	}
	return j + 2
}

// hex4 reads 4 hex digits at b[i:], or -1.
func hex4(b []byte, i int) rune {
	if i+4 > len(b) {
		return -1
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// skipStr checks a string's syntax without decoding it.
func (d *fastDec) skipStr() bool { return d.skipStrFrom(d.i + 1) }

// skipStrFrom validates the rest of a string from j, a position inside it
// between two characters, and moves past its closing quote. It reports
// whether that part escapes no lone surrogate.
func (d *fastDec) skipStrFrom(j int) (noLone bool) {
	b := d.b
	noLone = true
	if j+64 <= len(b) {
		// 64 bytes at a time: the string ends at the first quote that no
		// backslash escapes; only the escaped bytes before it are looked at
		// one by one, and only when they are not one-byte escapes.
		var carry uint64 // the block before ended with an escaping backslash
		checked := j     // escapes before this index are checked already
		for j+64 <= len(b) {
			q, bs, ctl := specialMasks64(&b[j])
			esc := escapedMask(bs, &carry)
			end := q &^ esc
			before := ^uint64(0)
			if end != 0 {
				before = end&-end - 1
			}
			if ctl&before != 0 {
				d.i = j + bits.TrailingZeros64(ctl&before)
				d.syntax()
			}
			for e := esc & before; e != 0; e &= e - 1 {
				k := j + bits.TrailingZeros64(e)
				if k < checked || simpleEscape[b[k]] {
					continue
				}
				next, lone := escapeEnd(b, k-1)
				if next < 0 {
					d.i = k - 1
					d.syntax()
				}
				noLone = noLone && !lone
				checked = next
			}
			if end != 0 {
				d.i = j + bits.TrailingZeros64(end) + 1
				return noLone
			}
			j += 64
		}
		// Resume between two characters: at an escape that straddles the
		// block end, or after the last one checked.
		if carry != 0 {
			j--
		}
		j = max(j, checked)
	}
	for {
		j = plainRun(b, j)
		if j >= len(b) {
			d.i = j
			d.syntax()
		}
		switch c := b[j]; {
		case c == '"':
			d.i = j + 1
			return noLone
		case c == '\\':
			next, lone := escapeEnd(b, j)
			if next < 0 {
				d.i = j
				d.syntax()
			}
			noLone = noLone && !lone
			j = next
		default:
			d.i = j
			d.syntax()
		}
	}
}

// simpleEscape[c]: \c is a one-byte escape.
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

// escapedMask returns the mask of the bytes of a 64-byte block that a
// backslash escapes, given the block's backslashes; carry is 1 when the
// block before ended with an escaping backslash, and is updated for the next
// block. (simdjson's branchless find_escaped: a run of backslashes escapes
// the byte after it when its length is odd.)
func escapedMask(backslash uint64, carry *uint64) uint64 {
	const even = 0x5555555555555555
	backslash &^= *carry
	followsEscape := backslash<<1 | *carry
	oddStarts := backslash &^ even &^ followsEscape
	seqOnEven, c := bits.Add64(oddStarts, backslash, 0)
	*carry = c
	return (even ^ seqOnEven<<1) & followsEscape
}

// key reads an object key and the colon after it.
func (d *fastDec) key() string {
	if d.peek() != '"' {
		d.syntax()
	}
	k := d.str()
	d.expect(':')
	return k
}

// keyView is key for a key that is only compared, never kept: without
// escapes it is a view of the input, not a copy.
func (d *fastDec) keyView() string {
	if d.peek() != '"' {
		d.syntax()
	}
	start := d.i + 1
	j := plainRun(d.b, start)
	if j >= len(d.b) || d.b[j] != '"' {
		return d.key() // escapes (or an error): decode into the arena
	}
	d.i = j + 1
	d.expect(':')
	if j == start {
		return ""
	}
	return unsafe.String(&d.b[start], j-start)
}

// more is called after an object member or array element: it consumes ','
// and returns true, or consumes the closing byte and returns false.
func (d *fastDec) more(closing byte) bool {
	switch d.peek() {
	case ',':
		d.i++
		return true
	case closing:
		d.i++
		return false
	}
	d.syntax()
	return false
}

// number reads a number token with encoding/json's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
// and returns it as a view of the input (valid until the input is released).
func (d *fastDec) number() string {
	b := d.b
	i := d.i
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		d.i = i
		d.syntax()
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.i = i
			d.syntax()
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.i = i
			d.syntax()
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	d.i = i
	return unsafe.String(&b[start], i-start)
}

// literal consumes "true", "false" or "null" (d.b[d.i] is its first byte).
func (d *fastDec) literal(lit string) {
	if len(d.b)-d.i < len(lit) || string(d.b[d.i:d.i+len(lit)]) != lit {
		d.syntax()
	}
	d.i += len(lit)
}

// keep copies a key view into the arena (a key already there stays).
func (d *fastDec) keep(k string) string {
	if len(k) == 0 {
		return ""
	}
	p := uintptr(unsafe.Pointer(unsafe.StringData(k)))
	if len(d.b) > 0 {
		lo := uintptr(unsafe.Pointer(&d.b[0]))
		if p < lo || p >= lo+uintptr(len(d.b)) {
			return k // not a view of the input: in the arena already
		}
	}
	start := len(d.arena)
	d.arena = append(d.arena, k...)
	return unsafe.String(&d.arena[start], len(k))
}

func (d *fastDec) push() {
	d.depth++
	if d.depth > fastMaxDepth {
		d.reject("nesting deeper than " + strconv.Itoa(fastMaxDepth))
	}
}

// skip checks the syntax of one value and discards it.
func (d *fastDec) skip() {
	switch c := d.peek(); c {
	case '"':
		d.skipStr()
	case '{':
		d.push()
		d.i++
		d.eachMember(func() {
			d.skipStr()
			d.expect(':')
			d.skip()
		})
		d.depth--
	case '[':
		d.elements(d.skip)
	case 't':
		d.literal("true")
	case 'f':
		d.literal("false")
	case 'n':
		d.literal("null")
	default:
		d.number()
	}
}

// eachMember calls fn for each member of the object whose '{' was consumed,
// at its key (fn reads the key, the colon and the value), then consumes the
// '}'.
func (d *fastDec) eachMember(fn func()) {
	if d.peek() == '}' {
		d.i++
		return
	}
	for {
		if d.peek() != '"' {
			d.syntax()
		}
		fn()
		if !d.more('}') {
			return
		}
	}
}

// float converts a number like json.Unmarshal into a float64 does; a number
// it refuses (out of range) cannot be stored.
func (d *fastDec) float(tok string) float64 {
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil {
		d.reject("number " + tok + " does not fit a float64")
	}
	return f
}

// any decodes a free-form value like json.Unmarshal into an `any` does
// (objects map[string]any with the last duplicate winning, arrays []any,
// numbers float64).
func (d *fastDec) any() any {
	switch c := d.peek(); c {
	case '"':
		return d.str()
	case '{':
		return d.object()
	case '[':
		a := []any{}
		d.elements(func() { a = append(a, d.any()) })
		return a
	case 't':
		d.literal("true")
		return true
	case 'f':
		d.literal("false")
		return false
	case 'n':
		d.literal("null")
		return nil
	default:
		return d.float(d.number())
	}
}

// object decodes a free-form object (d.b[d.i] == '{').
func (d *fastDec) object() map[string]any {
	d.push()
	d.i++
	m := map[string]any{}
	if d.peek() == '}' {
		d.i++
	} else {
		for {
			k := d.key()
			m[k] = d.any()
			if !d.more('}') {
				break
			}
		}
	}
	d.depth--
	return m
}

// ---- raw JSON text (DecodeOptions.RawJSON) ----

// rawStr reads a string (d.b[d.i] == '"') and returns the body of its JSON
// text, escapes as in the input, as a view of the arena. With n > 0, a
// string of more than n characters is cut to its first n-1 and "…"
// (DecodeOptions.ContentCut). When a character it would keep, or character
// n, escapes a lone surrogate, which JSON readers decode differently, it
// consumes nothing and returns false: the caller decodes the string.
//
// The string is validated first, 64 bytes at a time (skipStrFrom); then
// only a body longer than n bytes has its characters counted, up to n+1.
func (d *fastDec) rawStr(n int) (string, bool) {
	open := d.i
	noLone := d.skipStrFrom(open + 1)
	body := d.b[open+1 : d.i-1]
	if n > 0 && len(body) > n { // every character takes a byte at least
		cut, over, lone := bodyCut(body, n)
		if over {
			if lone {
				d.i = open
				return "", false
			}
			at := len(d.arena) // room: two characters, two quotes at least beyond cut
			d.arena = append(d.arena, body[:cut]...)
			d.arena = append(d.arena, "…"...)
			return unsafe.String(&d.arena[at], len(d.arena)-at), true
		}
	}
	if !noLone {
		d.i = open
		return "", false
	}
	if len(body) == 0 {
		return "", true
	}
	at := len(d.arena)
	d.arena = append(d.arena, body...)
	return unsafe.String(&d.arena[at], len(body)), true
}

// bodyCut reads the body of a valid JSON string (escapes as in the input):
// whether it stands for more than n (>= 1) characters, the byte length of
// its first n-1 when it does, and whether one of its first n escapes a lone
// surrogate. An escape is one character, a surrogate pair too. It reads no
// further than character n+1.
func bodyCut(body []byte, n int) (cut int, over, lone bool) {
	count := 0 // characters before i
	for i := 0; i < len(body); {
		// 8 ASCII bytes without a backslash are 8 characters; stop short
		// of the cut (character n-1) so that the steps below see it.
		for count+8 < n && i+8 <= len(body) {
			x := binary.LittleEndian.Uint64(body[i:])
			bs := x ^ 0x5c5c5c5c5c5c5c5c
			if (x|(bs-0x0101010101010101)&^bs)&0x8080808080808080 != 0 {
				break
			}
			i += 8
			count += 8
		}
		if i >= len(body) {
			break
		}
		if count == n-1 {
			cut = i
		}
		if count == n {
			return cut, true, lone
		}
		switch c := body[i]; {
		case c < utf8.RuneSelf && c != '\\':
			i++
		case c >= 0xF0: // valid UTF-8: the leading byte gives the length
			i += 4
		case c >= 0xE0:
			i += 3
		case c >= 0xC0:
			i += 2
		case body[i+1] != 'u':
			i += 2
		default:
			next, l := escapeEnd(body, i)
			lone = lone || l
			i = next
		}
		count++
	}
	return 0, false, lone
}

// escapeEnd returns the index after the escape at b[j] == '\\' (a
// surrogate pair counts as one escape), or -1 when it is not valid, and
// whether it is a lone surrogate.
func escapeEnd(b []byte, j int) (next int, lone bool) {
	if j+1 >= len(b) {
		return -1, false
	}
	switch b[j+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return j + 2, false
	case 'u':
		r := hex4(b, j+2)
		if r < 0 {
			return -1, false
		}
		if !utf16.IsSurrogate(r) {
			return j + 6, false
		}
		if j+7 < len(b) && b[j+6] == '\\' && b[j+7] == 'u' {
			if r1 := hex4(b, j+8); r1 >= 0 && utf16.DecodeRune(r, r1) != utf8.RuneError {
				return j + 12, false
			}
		}
		return j + 6, true
	}
	return -1, false
}

// rawMaxKeys bounds the keys of an object whose text rawObject hands out:
// checking them for repeats is quadratic.
const rawMaxKeys = 32

// rawObject validates a free-form object (d.b[d.i] == '{') exactly as object
// decodes it and returns its JSON text from the input as a view of the
// arena. When an object in it repeats a key (or has an escaped key, or more
// than rawMaxKeys keys), it consumes nothing and returns false: the caller
// decodes it, so that the value kept is the last one, as in the map. So it
// does when a string in it escapes a lone surrogate.
func (d *fastDec) rawObject() (string, bool) {
	start := d.i
	if !d.rawValue() {
		d.i = start
		return "", false
	}
	at := len(d.arena)
	d.arena = append(d.arena, d.b[start:d.i]...)
	return unsafe.String(&d.arena[at], d.i-start), true
}

// rawValue validates a free-form value as any decodes it, without decoding;
// false when an object in it is one rawObject does not hand out, or a
// string in it escapes a lone surrogate.
func (d *fastDec) rawValue() bool {
	switch c := d.peek(); c {
	case '{':
		return d.rawMembers()
	case '[':
		ok := true
		d.elements(func() { ok = d.rawValue() && ok })
		return ok
	case '"':
		return d.skipStr()
	case 't', 'f', 'n':
		d.skip()
	default:
		d.float(d.number())
	}
	return true
}

func (d *fastDec) rawMembers() bool {
	d.push()
	d.i++
	var buf [rawMaxKeys]string
	keys := buf[:0]
	ok := true
	d.eachMember(func() {
		k, plain := d.plainKey()
		if !plain || len(keys) == rawMaxKeys || slices.Contains(keys, k) {
			ok = false
		} else {
			keys = append(keys, k)
		}
		ok = d.rawValue() && ok
	})
	d.depth--
	return ok
}

// plainKey reads a key (d.b[d.i] == '"') and the colon after it. A key
// without escapes is returned as a view of the input; for one with escapes
// it returns false (after validating it).
func (d *fastDec) plainKey() (string, bool) {
	start := d.i + 1
	j := plainRun(d.b, start)
	if j < len(d.b) && d.b[j] == '"' {
		d.i = j + 1
		d.expect(':')
		return unsafe.String(unsafe.SliceData(d.b[start:]), j-start), true
	}
	d.skipStr()
	d.expect(':')
	return "", false
}

// ---- typed values: each returns ok=false (after consuming the value) when
// the value breaks its schema ----

func (d *fastDec) typedStr(what string) (string, bool) {
	if d.peek() != '"' {
		d.skip()
		return "", d.invalid(what + " is not a string")
	}
	return d.str(), true
}

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

func (d *fastDec) boundedStr(what string, minRunes, maxRunes int) (string, bool) {
	s, ok := d.typedStr(what)
	if ok && !lenOK(s, minRunes, maxRunes) {
		return s, d.invalid(what + " length out of bounds")
	}
	return s, ok
}

func (d *fastDec) boolean(what string) (bool, bool) {
	switch d.peek() {
	case 't':
		d.literal("true")
		return true, true
	case 'f':
		d.literal("false")
		return false, true
	}
	d.skip()
	return false, d.invalid(what + " is not a boolean")
}

// enumStr accepts a string equal to one of the values.
func (d *fastDec) enumStr(what string, values ...string) (string, bool) {
	s, ok := d.typedStr(what)
	if !ok {
		return "", false
	}
	for _, v := range values {
		if s == v {
			return s, true
		}
	}
	return s, d.invalid(what + " is not one of the allowed values")
}

func isNumberStart(c byte) bool { return c == '-' || ('0' <= c && c <= '9') }

// integer reads a JSON Schema integer: any number with an integral value
// (1, 1.0, 1e2, -0). It must fit an int to be stored.
func (d *fastDec) integer(what string) (int, bool) {
	if !isNumberStart(d.peek()) {
		d.skip()
		return 0, d.invalid(what + " is not an integer")
	}
	tok := d.number()
	v, integral, fits := parseIntegral(tok)
	if !integral {
		return 0, d.invalid(what + " is not an integer")
	}
	if !fits {
		d.reject(what + " " + tok + " does not fit an int")
	}
	return v, true
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

// dateTime reads a string with format date-time, as the schema library
// checks it, that time.Time can also parse (the struct stores a time.Time).
func (d *fastDec) dateTime(what string) (time.Time, bool) {
	s, ok := d.typedStr(what)
	if !ok {
		return time.Time{}, false
	}
	if !validDateTime(s) {
		return time.Time{}, d.invalid(what + " is not a date-time")
	}
	t, err := parseDateTime(s)
	if err != nil {
		d.reject(what + " cannot be parsed as a time: " + err.Error())
	}
	return t, true
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

// ---- the rollout ----

// Field bits of the top-level object.
const (
	fRolloutID = 1 << iota
	fEnvironment
	fAgent
	fTaskID
	fOutcome
	fMessages
	fSchema
	fStartTime
	fEndTime
	fTools
	fGrader
	fMetadata

	fRequired = fRolloutID | fEnvironment | fAgent | fTaskID | fOutcome | fMessages
)

// set records the last occurrence of a field: seen, and valid or not.
func set(seen, bad *uint32, bit uint32, ok bool) {
	*seen |= bit
	if ok {
		*bad &^= bit
	} else {
		*bad |= bit
	}
}

func (d *fastDec) rollout(r *Rollout) bool {
	d.push()
	d.i++
	var seen, bad uint32
	var reward string
	if d.peek() == '}' {
		d.i++
	} else {
		for {
			switch k := d.keyView(); k {
			case "schema":
				s, ok := d.typedStr("schema")
				if ok && s != "rollout/v1" {
					ok = d.invalid("schema is not rollout/v1")
				}
				r.Schema = s
				set(&seen, &bad, fSchema, ok)
			case "rollout_id":
				s, ok := d.boundedStr("rollout_id", 1, 256)
				r.RolloutID = s
				set(&seen, &bad, fRolloutID, ok)
			case "environment":
				s, ok := d.typedStr("environment")
				if ok && !validEnvironment(s) {
					ok = d.invalid("environment does not match its pattern or length")
				}
				r.Environment = s
				set(&seen, &bad, fEnvironment, ok)
			case "agent":
				r.Agent = Agent{}
				set(&seen, &bad, fAgent, d.agent(&r.Agent))
			case "task_id":
				s, ok := d.boundedStr("task_id", 1, 256)
				r.TaskID = s
				set(&seen, &bad, fTaskID, ok)
			case "start_time":
				t, ok := d.dateTime("start_time")
				r.StartTime = t
				set(&seen, &bad, fStartTime, ok)
			case "end_time":
				t, ok := d.dateTime("end_time")
				r.EndTime = t
				set(&seen, &bad, fEndTime, ok)
			case "outcome":
				r.Outcome = Outcome{}
				var ok bool
				reward, ok = d.outcome(&r.Outcome)
				set(&seen, &bad, fOutcome, ok)
			case "messages":
				r.Messages = nil
				set(&seen, &bad, fMessages, d.messages(r))
			case "tools":
				r.Tools = nil
				set(&seen, &bad, fTools, d.tools(r))
			case "grader":
				r.Grader = nil
				set(&seen, &bad, fGrader, d.grader(r))
			case "metadata":
				r.Metadata, r.MetadataJSON = nil, ""
				ok := d.peek() == '{'
				if ok {
					var raw bool
					if d.raw {
						r.MetadataJSON, raw = d.rawObject()
					}
					if !raw {
						r.Metadata = d.object()
					}
				} else {
					d.skip()
					d.invalid("metadata is not an object")
				}
				set(&seen, &bad, fMetadata, ok)
			default:
				d.skip()
			}
			if !d.more('}') {
				break
			}
		}
	}
	d.depth--
	if seen&fRequired != fRequired {
		return d.invalid("a required property is missing")
	}
	if bad != 0 {
		return false
	}
	// The schema path checks the reward last: finite as a float64.
	f, err := strconv.ParseFloat(reward, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		d.reject("reward " + reward + " is not a finite float64")
	}
	r.Outcome.Reward = f
	return true
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

// beginObject consumes '{' or, for another value, consumes it and returns false.
func (d *fastDec) beginObject(what string) bool {
	if d.peek() != '{' {
		d.skip()
		return d.invalid(what + " is not an object")
	}
	d.push()
	d.i++
	return true
}

// elements consumes the array at d.i ('[' not yet consumed), calling fn once
// per element; fn consumes the element.
func (d *fastDec) elements(fn func()) {
	d.push()
	d.i++
	if d.peek() == ']' {
		d.i++
	} else {
		for {
			fn()
			if !d.more(']') {
				break
			}
		}
	}
	d.depth--
}

// members calls fn for each member of the object whose '{' was consumed.
// The key passed to fn may be a view of the input: fn must not keep it.
func (d *fastDec) members(fn func(k string)) {
	if d.peek() == '}' {
		d.i++
	} else {
		for {
			fn(d.keyView())
			if !d.more('}') {
				break
			}
		}
	}
	d.depth--
}

func (d *fastDec) agent(a *Agent) bool {
	if !d.beginObject("agent") {
		return false
	}
	const fName, fVersion = 1, 2
	var seen, bad uint32
	d.members(func(k string) {
		switch k {
		case "name":
			s, ok := d.boundedStr("agent.name", 1, 256)
			a.Name = s
			set(&seen, &bad, fName, ok)
		case "version":
			s, ok := d.boundedStr("agent.version", 1, 128)
			a.Version = s
			set(&seen, &bad, fVersion, ok)
		default:
			d.skip()
		}
	})
	if seen&(fName|fVersion) != fName|fVersion {
		return d.invalid("agent: a required property is missing")
	}
	return bad == 0
}

// outcome returns the reward's token (checked for finiteness last).
func (d *fastDec) outcome(o *Outcome) (reward string, valid bool) {
	if !d.beginObject("outcome") {
		return "", false
	}
	const fReward, fSuccess = 1, 2
	var seen, bad uint32
	d.members(func(k string) {
		switch k {
		case "reward":
			ok := isNumberStart(d.peek())
			if ok {
				reward = d.number()
			} else {
				reward = ""
				d.skip()
				d.invalid("outcome.reward is not a number")
			}
			set(&seen, &bad, fReward, ok)
		case "success":
			v, ok := d.boolean("outcome.success")
			o.Success = nil
			if ok {
				o.Success = &v
			}
			set(&seen, &bad, fSuccess, ok)
		default:
			d.skip()
		}
	})
	if seen&fReward == 0 {
		return "", d.invalid("outcome.reward is missing")
	}
	return reward, bad == 0
}

func (d *fastDec) messages(r *Rollout) bool {
	if d.peek() != '[' {
		d.skip()
		return d.invalid("messages is not an array")
	}
	ok := true
	msgs := make([]Message, 0, 32)
	d.elements(func() {
		msgs = append(msgs, Message{})
		ok = d.message(&msgs[len(msgs)-1]) && ok
	})
	r.Messages = msgs
	if len(msgs) == 0 {
		return d.invalid("messages is empty")
	}
	return ok
}

func (d *fastDec) message(m *Message) bool {
	if !d.beginObject("message") {
		return false
	}
	const (
		fRole = 1 << iota
		fContent
		fToolCalls
		fToolCallID
		fError
		fRequestor
		fTurnIdx
	)
	var seen, bad uint32
	d.members(func(k string) {
		switch k {
		case "role":
			s, ok := d.enumStr("message.role", "system", "user", "assistant", "tool")
			m.Role = s
			set(&seen, &bad, fRole, ok)
		case "content":
			ok := true
			m.Content, m.ContentJSON = "", ""
			switch d.peek() {
			case '"':
				if d.raw {
					if s, raw := d.rawStr(d.rawCut); raw {
						m.ContentJSON = s
						break
					}
				}
				m.Content = d.strCapped(d.contentCap)
			case 'n':
				d.literal("null")
			default:
				d.skip()
				ok = d.invalid("message.content is neither a string nor null")
			}
			set(&seen, &bad, fContent, ok)
		case "tool_calls":
			m.ToolCalls = nil
			ok := true
			switch d.peek() {
			case '[':
				m.ToolCalls, ok = d.toolCalls()
			case 'n':
				d.literal("null")
			default:
				d.skip()
				ok = d.invalid("message.tool_calls is neither an array nor null")
			}
			set(&seen, &bad, fToolCalls, ok)
		case "tool_call_id":
			s, ok := d.typedStr("message.tool_call_id")
			m.ToolCallID = s
			set(&seen, &bad, fToolCallID, ok)
		case "error":
			v, ok := d.boolean("message.error")
			m.Error = v
			set(&seen, &bad, fError, ok)
		case "requestor":
			s, ok := d.enumStr("message.requestor", "assistant", "user")
			m.Requestor = s
			set(&seen, &bad, fRequestor, ok)
		case "turn_idx":
			v, ok := d.integer("message.turn_idx")
			m.TurnIdx = nil
			if ok {
				m.TurnIdx = &v
			}
			set(&seen, &bad, fTurnIdx, ok)
		default:
			d.skip()
		}
	})
	if seen&fRole == 0 {
		return d.invalid("message.role is missing")
	}
	if bad != 0 {
		return false
	}
	if m.Role == "tool" && seen&fToolCallID == 0 {
		return d.invalid("a tool message has no tool_call_id")
	}
	return true
}

func (d *fastDec) toolCalls() ([]ToolCall, bool) {
	ok := true
	calls := []ToolCall{}
	d.elements(func() {
		calls = append(calls, ToolCall{})
		ok = d.toolCall(&calls[len(calls)-1]) && ok
	})
	return calls, ok
}

func (d *fastDec) toolCall(tc *ToolCall) bool {
	if !d.beginObject("tool call") {
		return false
	}
	const fID, fName, fArgs, fRequestor = 1, 2, 4, 8
	var seen, bad uint32
	d.members(func(k string) {
		switch k {
		case "id":
			s, ok := d.boundedStr("tool_call.id", 1, -1)
			tc.ID = s
			set(&seen, &bad, fID, ok)
		case "name":
			s, ok := d.boundedStr("tool_call.name", 1, -1)
			tc.Name = s
			set(&seen, &bad, fName, ok)
		case "arguments":
			tc.Arguments, tc.ArgumentsJSON = nil, ""
			ok := d.peek() == '{'
			if ok {
				var raw bool
				if d.raw {
					tc.ArgumentsJSON, raw = d.rawObject()
				}
				if !raw {
					tc.Arguments = d.object()
				}
			} else {
				d.skip()
				d.invalid("tool_call.arguments is not an object")
			}
			set(&seen, &bad, fArgs, ok)
		case "requestor":
			s, ok := d.enumStr("tool_call.requestor", "assistant", "user")
			tc.Requestor = s
			set(&seen, &bad, fRequestor, ok)
		default:
			d.skip()
		}
	})
	if seen&(fID|fName|fArgs) != fID|fName|fArgs {
		return d.invalid("tool_call: a required property is missing")
	}
	return bad == 0
}

func (d *fastDec) tools(r *Rollout) bool {
	if d.peek() != '[' {
		d.skip()
		return d.invalid("tools is not an array")
	}
	if t, n := cachedTools(d.b[d.i:]); n > 0 {
		d.i += n
		r.Tools = t
		return true
	}
	start := d.i
	ok := true
	tools := []Tool{}
	d.elements(func() {
		tools = append(tools, Tool{})
		ok = d.tool(&tools[len(tools)-1]) && ok
	})
	r.Tools = tools
	if ok {
		r.Tools = cacheTools(d.b[start:d.i], tools)
	}
	return ok
}

// Tool definitions are the same in every rollout of an agent version, so
// the decoder remembers the last toolsCacheSize tool arrays that were valid,
// by their exact bytes. Input that starts with those bytes holds that same
// array (a JSON array ends itself), so a hit takes the decoded tools without
// parsing. The cached []Tool is shared by every rollout that hit it: see
// SharedTools.
const toolsCacheSize = 16

type toolsEntry struct {
	raw   []byte
	tools []Tool
}

var toolsCache atomic.Pointer[[]toolsEntry] // copy on write

// cachedTools returns the cached tools whose bytes b starts with, and how
// many bytes they take (0: none).
func cachedTools(b []byte) ([]Tool, int) {
	if c := toolsCache.Load(); c != nil {
		for _, e := range *c {
			if bytes.HasPrefix(b, e.raw) {
				return e.tools, len(e.raw)
			}
		}
	}
	return nil, 0
}

// cacheTools caches a copy of tools (owning its strings) and returns it.
func cacheTools(raw []byte, tools []Tool) []Tool {
	if len(tools) == 0 {
		return tools
	}
	// The cached tools must not view the decode buffer (it may be reused).
	own := make([]Tool, len(tools))
	for i, t := range tools {
		own[i] = Tool{Type: strings.Clone(t.Type), Function: FunctionDef{Name: strings.Clone(t.Function.Name),
			Description: strings.Clone(t.Function.Description), Parameters: bytes.Clone(t.Function.Parameters)}}
	}
	e := toolsEntry{raw: bytes.Clone(raw), tools: own}
	for {
		old := toolsCache.Load()
		var entries []toolsEntry
		if old != nil {
			entries = *old
		}
		next := make([]toolsEntry, 0, min(len(entries)+1, toolsCacheSize))
		next = append(next, e)
		next = append(next, entries[:min(len(entries), toolsCacheSize-1)]...)
		if toolsCache.CompareAndSwap(old, &next) {
			return own
		}
	}
}

// SharedTools reports whether tools is a decoder-cached tool array, shared
// by every decoded rollout that carried the same tool definitions: such a
// slice (and its contents) must not be modified, and it is the same slice
// for the same definitions while it stays cached.
func SharedTools(tools []Tool) bool {
	if len(tools) == 0 {
		return false
	}
	if c := toolsCache.Load(); c != nil {
		for _, e := range *c {
			if len(e.tools) == len(tools) && &e.tools[0] == &tools[0] {
				return true
			}
		}
	}
	return false
}

func (d *fastDec) tool(t *Tool) bool {
	if !d.beginObject("tool") {
		return false
	}
	const fType, fFunction = 1, 2
	var seen, bad uint32
	d.members(func(k string) {
		switch k {
		case "type":
			s, ok := d.typedStr("tool.type")
			if ok && s != "function" {
				ok = d.invalid("tool.type is not \"function\"")
			}
			t.Type = s
			set(&seen, &bad, fType, ok)
		case "function":
			t.Function = FunctionDef{}
			set(&seen, &bad, fFunction, d.function(&t.Function))
		default:
			d.skip()
		}
	})
	if seen&(fType|fFunction) != fType|fFunction {
		return d.invalid("tool: a required property is missing")
	}
	return bad == 0
}

func (d *fastDec) function(f *FunctionDef) bool {
	if !d.beginObject("tool.function") {
		return false
	}
	const fName, fDescription, fParameters = 1, 2, 4
	var seen, bad uint32
	d.members(func(k string) {
		switch k {
		case "name":
			s, ok := d.boundedStr("tool.function.name", 1, -1)
			f.Name = s
			set(&seen, &bad, fName, ok)
		case "description":
			s, ok := d.typedStr("tool.function.description")
			f.Description = s
			set(&seen, &bad, fDescription, ok)
		case "parameters":
			f.Parameters = nil
			ok := d.peek() == '{'
			start := d.i
			d.skip()
			if ok {
				// json.RawMessage: the value's bytes as they are, copied.
				f.Parameters = append([]byte(nil), d.b[start:d.i]...)
			} else {
				d.invalid("tool.function.parameters is not an object")
			}
			set(&seen, &bad, fParameters, ok)
		default:
			d.skip()
		}
	})
	if seen&fName == 0 {
		return d.invalid("tool.function.name is missing")
	}
	return bad == 0
}

func (d *fastDec) grader(r *Rollout) bool {
	if !d.beginObject("grader") {
		return false
	}
	g := &Grader{}
	r.Grader = g
	const fReasons, fBreakdown = 1, 2
	var seen, bad uint32
	d.members(func(k string) {
		switch k {
		case "reasons":
			g.Reasons = nil
			ok := d.peek() == '['
			if !ok {
				d.skip()
				d.invalid("grader.reasons is not an array")
				set(&seen, &bad, fReasons, false)
				return
			}
			reasons := []string{}
			d.elements(func() {
				s, sok := d.typedStr("grader.reasons item")
				reasons = append(reasons, s)
				ok = ok && sok
			})
			g.Reasons = reasons
			set(&seen, &bad, fReasons, ok)
		case "breakdown":
			g.Breakdown = nil
			if !d.beginObject("grader.breakdown") {
				set(&seen, &bad, fBreakdown, false)
				return
			}
			ok := true
			bd := map[string]float64{}
			d.members(func(k string) {
				k = d.keep(k)
				if isNumberStart(d.peek()) {
					bd[k] = d.float(d.number())
					return
				}
				// A later duplicate of k cannot make this valid: the schema
				// checks the last value, so remember the key's state.
				d.skip()
				bd[k] = math.NaN() // marks "not a number" until replaced
			})
			for _, v := range bd {
				if math.IsNaN(v) {
					ok = d.invalid("a grader.breakdown value is not a number")
				}
			}
			g.Breakdown = bd
			set(&seen, &bad, fBreakdown, ok)
		default:
			d.skip()
		}
	})
	return bad == 0
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
