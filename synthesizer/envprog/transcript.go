package envprog

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// transcriptValue is the transcript argument of reward(state, transcript):
// a read-only sequence of message dicts that behaves like a list (len,
// indexing, negative indices, slicing, iteration, `in`, list(t)) and builds
// each message dict only when the program reads it. Most rewards read the
// state and at most the last message, so building every dict (and parsing
// every call's arguments again) up front would cost more than the reward.
//
// A message dict has role and content; an assistant message has
// tool_calls, a list of {"id", "name", "arguments"} with arguments a dict
// (or the raw text when it was not a JSON object); a tool message has
// tool_call_id and name.
type transcriptValue struct {
	msgs  []Message
	cache []starlark.Value
}

var (
	_ starlark.Indexable  = (*transcriptValue)(nil)
	_ starlark.Sliceable  = (*transcriptValue)(nil)
	_ starlark.Sequence   = (*transcriptValue)(nil)
	_ starlark.Comparable = (*transcriptValue)(nil)
)

func (t *transcriptValue) String() string {
	return fmt.Sprintf("<transcript of %d messages>", len(t.msgs))
}
func (t *transcriptValue) Type() string          { return "transcript" }
func (t *transcriptValue) Freeze()               {}
func (t *transcriptValue) Truth() starlark.Bool  { return len(t.msgs) > 0 }
func (t *transcriptValue) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: transcript") }
func (t *transcriptValue) Len() int              { return len(t.msgs) }

func (t *transcriptValue) Index(i int) starlark.Value {
	if t.cache[i] == nil {
		t.cache[i] = messageValue(t.msgs[i])
	}
	return t.cache[i]
}

func (t *transcriptValue) Slice(start, end, step int) starlark.Value {
	var out []starlark.Value
	if step > 0 {
		for i := start; i < end; i += step {
			out = append(out, t.Index(i))
		}
	} else {
		for i := start; i > end; i += step {
			out = append(out, t.Index(i))
		}
	}
	return starlark.NewList(out)
}

func (t *transcriptValue) Iterate() starlark.Iterator { return &transcriptIter{t: t} }

// CompareSameType lets transcripts compare equal message by message.
func (t *transcriptValue) CompareSameType(op syntax.Token, y starlark.Value, depth int) (bool, error) {
	u := y.(*transcriptValue)
	switch op {
	case syntax.EQL, syntax.NEQ:
		eq := len(t.msgs) == len(u.msgs)
		for i := 0; eq && i < len(t.msgs); i++ {
			var err error
			if eq, err = starlark.EqualDepth(t.Index(i), u.Index(i), depth-1); err != nil {
				return false, err
			}
		}
		return eq == (op == syntax.EQL), nil
	}
	return false, fmt.Errorf("transcripts cannot be ordered")
}

type transcriptIter struct {
	t *transcriptValue
	i int
}

func (it *transcriptIter) Next(p *starlark.Value) bool {
	if it.i >= len(it.t.msgs) {
		return false
	}
	*p = it.t.Index(it.i)
	it.i++
	return true
}

func (it *transcriptIter) Done() {}

func messageValue(m Message) starlark.Value {
	d := starlark.NewDict(4)
	_ = d.SetKey(kRole, starlark.String(m.Role))
	_ = d.SetKey(kContent, starlark.String(m.Content))
	switch m.Role {
	case "assistant":
		calls := make([]starlark.Value, 0, len(m.ToolCalls))
		for _, tc := range m.ToolCalls {
			c := starlark.NewDict(3)
			_ = c.SetKey(kID, starlark.String(tc.ID))
			_ = c.SetKey(kName, starlark.String(tc.Name))
			var args starlark.Value
			if a, err := parseArguments(tc.Arguments); err == nil {
				args = a
			} else {
				args = starlark.String(string(tc.Arguments))
			}
			_ = c.SetKey(kArguments, args)
			calls = append(calls, c)
		}
		_ = d.SetKey(kToolCalls, starlark.NewList(calls))
	case "tool":
		_ = d.SetKey(kToolCall, starlark.String(m.ToolCallID))
		_ = d.SetKey(kName, starlark.String(m.Name))
	}
	return d
}
