package envprog

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"go.starlark.net/starlark"
)

// Conversions between JSON text and Starlark values, and the deep copy
// that keeps episodes from sharing state. They are written out here rather
// than going through encoding/json's map[string]any because a step
// converts its arguments and its result, and because dicts keep their key
// order both ways.

const maxNesting = 512

var errNesting = errors.New("value nested deeper than 512 levels (a list or dict that contains itself?)")

// fromJSON parses JSON text into a Starlark value: objects become dicts
// (in key order), arrays lists, integers int, other numbers float.
func fromJSON(b []byte) (starlark.Value, error) {
	p := jsonParser{b: b}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.b) {
		return nil, p.errorf("unexpected %q after the value", p.b[p.i])
	}
	return v, nil
}

type jsonParser struct {
	b []byte
	i int
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) literal(word string, v starlark.Value) (starlark.Value, error) {
	if len(p.b)-p.i >= len(word) && string(p.b[p.i:p.i+len(word)]) == word {
		p.i += len(word)
		return v, nil
	}
	return nil, p.errorf("unexpected %q", p.b[p.i])
}

func (p *jsonParser) value(depth int) (starlark.Value, error) {
	if depth > maxNesting {
		return nil, errNesting
	}
	if p.i >= len(p.b) {
		return nil, p.errorf("unexpected end")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		p.i++
		d := starlark.NewDict(4)
		p.space()
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			return d, nil
		}
		for {
			p.space()
			if p.i >= len(p.b) || p.b[p.i] != '"' {
				return nil, p.errorf("want a string key")
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			p.space()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return nil, p.errorf("want ':'")
			}
			p.i++
			p.space()
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if err := d.SetKey(starlark.String(k), v); err != nil {
				return nil, err
			}
			p.space()
			if p.i >= len(p.b) {
				return nil, p.errorf("unexpected end in object")
			}
			if p.b[p.i] == '}' {
				p.i++
				return d, nil
			}
			if p.b[p.i] != ',' {
				return nil, p.errorf("want ',' or '}'")
			}
			p.i++
		}
	case c == '[':
		p.i++
		var elems []starlark.Value
		p.space()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			return starlark.NewList(nil), nil
		}
		for {
			p.space()
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			elems = append(elems, v)
			p.space()
			if p.i >= len(p.b) {
				return nil, p.errorf("unexpected end in array")
			}
			if p.b[p.i] == ']' {
				p.i++
				return starlark.NewList(elems), nil
			}
			if p.b[p.i] != ',' {
				return nil, p.errorf("want ',' or ']'")
			}
			p.i++
		}
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return starlark.String(s), nil
	case c == 't':
		return p.literal("true", starlark.True)
	case c == 'f':
		return p.literal("false", starlark.False)
	case c == 'n':
		return p.literal("null", starlark.None)
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return nil, p.errorf("unexpected %q", c)
	}
}

func (p *jsonParser) str() (string, error) {
	start := p.i
	p.i++
	plain := true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if plain {
				s := p.b[start+1 : p.i-1]
				if !utf8.Valid(s) {
					return "", p.errorf("invalid UTF-8 in string")
				}
				return string(s), nil
			}
			s, ok := unescape(p.b[start+1 : p.i-1])
			if !ok {
				return "", p.errorf("invalid string escape or UTF-8")
			}
			return s, nil
		case c == '\\':
			plain = false
			p.i += 2
		case c < 0x20:
			return "", p.errorf("control character in string")
		default:
			p.i++
		}
	}
	return "", p.errorf("unterminated string")
}

// unescape decodes the body of a JSON string that has escapes.
func unescape(b []byte) (string, bool) {
	out, ok := unescapeBytes(b)
	return string(out), ok
}

// unescapeBytes decodes the body of a JSON string into new bytes; it
// refuses bad escapes, raw quotes and control characters, and invalid UTF-8.
func unescapeBytes(b []byte) ([]byte, bool) {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		if c != '\\' {
			if c == '"' || c < 0x20 {
				return nil, false
			}
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(b) {
			return nil, false
		}
		switch b[i+1] {
		case '"', '\\', '/':
			out = append(out, b[i+1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(b[i+2:])
			if !ok {
				return nil, false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if r2, ok := hex4(b[min(i+2, len(b)):]); ok && i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						out = utf8.AppendRune(out, d)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
			continue
		default:
			return nil, false
		}
		i += 2
	}
	if !utf8.Valid(out) {
		return nil, false
	}
	return out, true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func (p *jsonParser) number() (starlark.Value, error) {
	start := p.i
	isFloat := false
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c >= '0' && c <= '9' || c == '-' || c == '+' {
			p.i++
		} else if c == '.' || c == 'e' || c == 'E' {
			isFloat = true
			p.i++
		} else {
			break
		}
	}
	text := string(p.b[start:p.i])
	if !json.Valid(p.b[start:p.i]) {
		return nil, p.errorf("invalid number %q", text)
	}
	if !isFloat {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return starlark.MakeInt64(n), nil
		}
		var z big.Int
		if _, ok := z.SetString(text, 10); ok {
			return starlark.MakeBigInt(&z), nil
		}
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return nil, p.errorf("invalid number %q", text)
	}
	return starlark.Float(f), nil
}

// appendJSON appends v as JSON text: dicts (string keys, in order) as
// objects, lists and tuples as arrays, None as null.
func appendJSON(b []byte, v starlark.Value) ([]byte, error) {
	return appendJSONDepth(b, v, 0)
}

func appendJSONDepth(b []byte, v starlark.Value, depth int) ([]byte, error) {
	if depth > maxNesting {
		return b, errNesting
	}
	switch x := v.(type) {
	case starlark.NoneType:
		return append(b, "null"...), nil
	case starlark.Bool:
		if x {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case starlark.Int:
		if n, ok := x.Int64(); ok {
			return strconv.AppendInt(b, n, 10), nil
		}
		return append(b, x.String()...), nil
	case starlark.Float:
		f := float64(x)
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return b, fmt.Errorf("cannot encode %v as JSON", f)
		}
		n := len(b)
		b = strconv.AppendFloat(b, f, 'g', -1, 64)
		integral := true
		for _, c := range b[n:] {
			if c == '.' || c == 'e' || c == 'n' || c == 'N' {
				integral = false
				break
			}
		}
		if integral {
			b = append(b, ".0"...)
		}
		return b, nil
	case starlark.String:
		return appendJSONString(b, string(x)), nil
	case *starlark.List:
		b = append(b, '[')
		for i := 0; i < x.Len(); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSONDepth(b, x.Index(i), depth+1); err != nil {
				return b, err
			}
		}
		return append(b, ']'), nil
	case starlark.Tuple:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSONDepth(b, e, depth+1); err != nil {
				return b, err
			}
		}
		return append(b, ']'), nil
	case *starlark.Dict:
		// Items, not Entries: a range-over-func body would move b and
		// err to the heap, an allocation per dict and value.
		b = append(b, '{')
		it := x.Iterate()
		defer it.Done()
		var key starlark.Value
		for i := 0; it.Next(&key); i++ {
			k, ok := key.(starlark.String)
			if !ok {
				return b, fmt.Errorf("cannot encode a dict with a %s key as JSON", key.Type())
			}
			val, _, _ := x.Get(key)
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, string(k))
			b = append(b, ':')
			var err error
			if b, err = appendJSONDepth(b, val, depth+1); err != nil {
				return b, err
			}
		}
		return append(b, '}'), nil
	default:
		return b, fmt.Errorf("cannot encode a %s as JSON", v.Type())
	}
}

const hexDigits = "0123456789abcdef"

func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\t':
				b = append(b, '\\', 't')
			case '\r':
				b = append(b, '\\', 'r')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// toJSON returns v as JSON text.
func toJSON(v starlark.Value) ([]byte, error) { return appendJSON(nil, v) }

// resultText is a tool result as the policy sees it: a string as is,
// anything else as JSON.
func resultText(v starlark.Value) (string, error) {
	if s, ok := v.(starlark.String); ok {
		return string(s), nil
	}
	b, err := appendJSON(make([]byte, 0, 128), v)
	return string(b), err
}

// needsCopy reports whether v reaches a frozen container (a module global
// or part of one). A value reset built afresh reaches none and is private
// to its episode already: only module globals are shared, and they are
// frozen. Frozenness is probed without changing anything: deleting a key
// no value equals, or assigning a list's first element to itself, fails on
// a frozen container only. A structure deeper than maxNesting (a cycle)
// is reported as needing the copy, which handles cycles.
func needsCopy(v starlark.Value, depth int) bool {
	if depth > maxNesting {
		return true
	}
	switch x := v.(type) {
	case starlark.NoneType, starlark.Bool, starlark.Int, starlark.Float, starlark.String, starlark.Bytes,
		*starlark.Function, *starlark.Builtin:
		return false
	case *starlark.List:
		if x.Len() == 0 {
			if x.Append(starlark.None) != nil {
				return true
			}
			_ = x.Clear()
			return false
		}
		if x.SetIndex(0, x.Index(0)) != nil {
			return true
		}
		for i := 0; i < x.Len(); i++ {
			if needsCopy(x.Index(i), depth+1) {
				return true
			}
		}
		return false
	case starlark.Tuple:
		for _, e := range x {
			if needsCopy(e, depth+1) {
				return true
			}
		}
		return false
	case *starlark.Dict:
		if _, _, err := x.Delete(probe{}); err != nil {
			return true
		}
		it := x.Iterate()
		defer it.Done()
		var k starlark.Value
		for it.Next(&k) {
			if v, _, _ := x.Get(k); needsCopy(v, depth+1) {
				return true
			}
		}
		return false
	case *starlark.Set:
		_, err := x.Delete(probe{})
		return err != nil
	case *rng:
		return x.frozen
	default:
		return true // let deepCopy accept or refuse it
	}
}

// probe is a dict key no key equals (keys of other types never do).
type probe struct{}

func (probe) String() string        { return "<probe>" }
func (probe) Type() string          { return "envprog.probe" }
func (probe) Freeze()               {}
func (probe) Truth() starlark.Bool  { return false }
func (probe) Hash() (uint32, error) { return 0x5f3759df, nil }

// privateState returns v itself when it is already private to one episode
// (see needsCopy), else a deep copy.
func privateState(v starlark.Value) (starlark.Value, error) {
	if !needsCopy(v, 0) {
		return v, nil
	}
	return deepCopy(v)
}

// deepCopy returns a copy of v that shares no mutable value with it, and
// whose containers are not frozen, so an episode may mutate the state that
// reset returned even if reset returned (part of) a frozen module global.
// Aliasing inside v is preserved and cycles are copied as cycles.
func deepCopy(v starlark.Value) (starlark.Value, error) {
	c := copier{seen: map[starlark.Value]starlark.Value{}}
	return c.copy(v, 0)
}

type copier struct {
	seen map[starlark.Value]starlark.Value
	// bytes estimates the memory the copy holds (the reset cache's budget):
	// Go's sizes of the values and their strings, without allocator slack.
	bytes int64
	// shared is set when the copy shares a function or builtin with v
	// (they are not copied): a closure or a bound method made by reset may
	// reach v's mutable values.
	shared bool
	// limit, when positive, stops the copy with errCopyLimit once bytes
	// passes it, before the container that passes it is allocated: the
	// reset cache's copy of a state too large to keep costs no more than
	// what it would keep.
	limit int64
}

var errCopyLimit = errors.New("the copy is larger than its limit")

// grow adds n to the copy's estimated bytes.
func (c *copier) grow(n int64) error {
	c.bytes += n
	if c.limit > 0 && c.bytes > c.limit {
		return errCopyLimit
	}
	return nil
}

// Estimated sizes (bytes) of Starlark values, for copier.bytes: an
// interface slot or a string header is 16; a dict or set holds its first
// 8 entries in a bucket of its own (~640 bytes with the table), and ~72
// bytes per entry beyond them.
const (
	sizeSlot  = 16
	sizeList  = 48
	sizeDict  = 640
	sizeEntry = 72
	sizeRand  = 48
)

func sizeOfTable(n int) int64 { return sizeDict + sizeEntry*int64(max(0, n-8)) }

func (c *copier) copy(v starlark.Value, depth int) (starlark.Value, error) {
	if depth > maxNesting {
		return nil, errNesting
	}
	switch x := v.(type) {
	case starlark.NoneType, starlark.Bool, starlark.Int, starlark.Float:
		return v, nil
	case starlark.String:
		return v, c.grow(sizeSlot + int64(len(x)))
	case starlark.Bytes:
		return v, c.grow(sizeSlot + int64(len(x)))
	case *starlark.List:
		if y, ok := c.seen[x]; ok {
			return y, nil
		}
		if err := c.grow(sizeList + sizeSlot*int64(x.Len())); err != nil {
			return nil, err
		}
		out := starlark.NewList(make([]starlark.Value, 0, x.Len()))
		c.seen[x] = out
		for i := 0; i < x.Len(); i++ {
			e, err := c.copy(x.Index(i), depth+1)
			if err != nil {
				return nil, err
			}
			_ = out.Append(e)
		}
		return out, nil
	case starlark.Tuple:
		if err := c.grow(sizeSlot * int64(len(x))); err != nil {
			return nil, err
		}
		out := make(starlark.Tuple, len(x))
		for i, e := range x {
			var err error
			if out[i], err = c.copy(e, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case *starlark.Dict:
		if y, ok := c.seen[x]; ok {
			return y, nil
		}
		if err := c.grow(sizeOfTable(x.Len())); err != nil {
			return nil, err
		}
		out := starlark.NewDict(x.Len())
		c.seen[x] = out
		for _, kv := range x.Items() {
			v, err := c.copy(kv[1], depth+1)
			if err == nil {
				err = out.SetKey(kv[0], v)
			}
			if err != nil {
				return nil, err
			}
		}
		return out, nil
	case *starlark.Set:
		if y, ok := c.seen[x]; ok {
			return y, nil
		}
		if err := c.grow(sizeOfTable(x.Len())); err != nil {
			return nil, err
		}
		out := starlark.NewSet(x.Len())
		c.seen[x] = out
		iter := x.Iterate()
		defer iter.Done()
		var e starlark.Value
		for iter.Next(&e) {
			if err := out.Insert(e); err != nil { // set elements are hashable, hence immutable
				return nil, err
			}
		}
		return out, nil
	case *rng:
		if y, ok := c.seen[x]; ok {
			return y, nil
		}
		y := x.copy()
		c.seen[x] = y
		return y, c.grow(sizeRand)
	case *starlark.Function, *starlark.Builtin:
		c.shared = true
		return v, nil // frozen with their module
	default:
		return nil, fmt.Errorf("cannot copy a %s held in the state", v.Type())
	}
}
