package simulate

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/traceops/trace/schemas"
)

// conv builds one conversation: messages in order, tool calls with ids and
// their results, and the elapsed time of the episode.
type conv struct {
	rng  *rand.Rand
	msgs []schemas.Message
	dur  time.Duration
	// prior is the running concatenation of user and tool message contents,
	// the text an argument can be grounded in.
	prior strings.Builder
	// lastUser is the content of the last user message.
	lastUser string
}

func newConv(rng *rand.Rand, policy string) *conv {
	c := &conv{rng: rng}
	c.msgs = append(c.msgs, schemas.Message{Role: "system", Content: policy})
	return c
}

func (c *conv) turn() *int {
	t := len(c.msgs) - 1 // the system message is not a turn
	return &t
}

func (c *conv) wait(minMs, maxMs int) {
	c.dur += time.Duration(minMs+c.rng.IntN(maxMs-minMs+1)) * time.Millisecond
}

// assistant appends an assistant text message.
func (c *conv) assistant(text string) {
	c.wait(1500, 9000)
	c.msgs = append(c.msgs, schemas.Message{Role: "assistant", Content: text, TurnIdx: c.turn()})
}

// user appends a user message.
func (c *conv) user(text string) {
	c.wait(2500, 15000)
	c.msgs = append(c.msgs, schemas.Message{Role: "user", Content: text, TurnIdx: c.turn()})
	c.addPrior(text)
	c.lastUser = text
}

func (c *conv) addPrior(s string) {
	if c.prior.Len() > 0 {
		c.prior.WriteByte('\n')
	}
	c.prior.WriteString(s)
}

// grounded reports whether s appears in a user or tool message so far.
func (c *conv) grounded(s string) bool { return strings.Contains(c.prior.String(), s) }

// callSpec is one tool call and the result the environment returns.
type callSpec struct {
	name   string
	args   map[string]any
	result string
	err    bool
}

// call appends one assistant message carrying the calls (with optional
// text) and one tool message per call, in order.
func (c *conv) call(text string, calls ...callSpec) {
	c.wait(1200, 6000)
	m := schemas.Message{Role: "assistant", Content: text, TurnIdx: c.turn()}
	ids := make([]string, len(calls))
	for i, cs := range calls {
		ids[i] = c.callID()
		m.ToolCalls = append(m.ToolCalls, schemas.ToolCall{ID: ids[i], Name: cs.name, Arguments: cs.args, Requestor: "assistant"})
	}
	c.msgs = append(c.msgs, m)
	for i, cs := range calls {
		c.wait(40, 600)
		c.msgs = append(c.msgs, schemas.Message{
			Role: "tool", Content: cs.result, ToolCallID: ids[i], Error: cs.err,
			Requestor: "assistant", TurnIdx: c.turn(),
		})
		c.addPrior(cs.result)
	}
}

const idAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// callID returns an OpenAI-style tool call id.
func (c *conv) callID() string {
	var b [29]byte
	copy(b[:], "call_")
	for i := 5; i < len(b); i++ {
		b[i] = idAlphabet[c.rng.IntN(len(idAlphabet))]
	}
	return string(b[:])
}

// --- tool results as Python-style JSON text (what τ² environments return) ---

// kv is one member of an ordered JSON object.
type kv struct {
	k string
	v any
}

// obj is a JSON object whose members keep their order.
type obj []kv

// pyJSON encodes v the way Python's json.dumps does by default: ", " and
// ": " separators, members in insertion order, floats with a fraction.
func pyJSON(v any) string {
	var b strings.Builder
	writePy(&b, v)
	return b.String()
}

func writePy(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case obj:
		b.WriteByte('{')
		for i, m := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Quote(m.k))
			b.WriteString(": ")
			writePy(b, m.v)
		}
		b.WriteByte('}')
	case []obj:
		writePyList(b, x)
	case []string:
		writePyList(b, x)
	case []any:
		writePyList(b, x)
	case string:
		b.WriteString(strconv.Quote(x))
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int:
		b.WriteString(strconv.Itoa(x))
	case float64:
		s := strconv.FormatFloat(x, 'f', -1, 64)
		if !strings.ContainsAny(s, ".eE") {
			s += ".0"
		}
		b.WriteString(s)
	default:
		panic("simulate: pyJSON: unsupported type")
	}
}

// writePyList writes a list, each element by writePy.
func writePyList[E any](b *strings.Builder, xs []E) {
	b.WriteByte('[')
	for i, e := range xs {
		if i > 0 {
			b.WriteString(", ")
		}
		writePy(b, e)
	}
	b.WriteByte(']')
}

// money formats a dollar amount the way agents write it.
func money(f float64) string {
	if f == float64(int(f)) {
		return "$" + strconv.Itoa(int(f))
	}
	return "$" + strconv.FormatFloat(f, 'f', 2, 64)
}

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

func digits(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	b[0] = byte('1' + rng.IntN(9))
	for i := 1; i < n; i++ {
		b[i] = byte('0' + rng.IntN(10))
	}
	return string(b)
}

func upperAlnum(rng *rand.Rand, n int) string {
	const a = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = a[rng.IntN(len(a))]
	}
	return string(b)
}

// round2 rounds to cents.
func round2(f float64) float64 { return float64(int(f*100+0.5)) / 100 }
