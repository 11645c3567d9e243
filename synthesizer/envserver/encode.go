package envserver

import (
	"encoding/json"
	"strconv"

	"github.com/traceops/trace/synthesizer/envprog"
)

// The observation is encoded by hand, field for field as
// openenv.StepResponse and openenv.Observation declare them (a test decodes
// it into those types): the tools are encoded once per environment and the
// transcript, which only grows, once per message, so that a step costs the
// encoding of what it added rather than of the whole episode.

// appendJSON appends v's JSON encoding.
func appendJSON(b []byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		// Only strings, numbers and maps of them are encoded here.
		panic(err)
	}
	return append(b, j...)
}

func appendString(b []byte, s string) []byte { return appendJSON(b, s) }

// encodeMessages brings p's encoded transcript up to date.
func (p *play) encodeMessages() {
	msgs := p.ep.Messages()
	for i := p.encoded; i < len(msgs); i++ {
		m := chatMessages(msgs[i : i+1])[0]
		if i == 0 && p.hinted && m.Role == "system" {
			m.Content += "\n\n" + envprog.HintOpen + p.hint + envprog.HintClose
		}
		if i > 0 {
			p.msgJSON = append(p.msgJSON, ',')
		}
		p.msgStart = append(p.msgStart, len(p.msgJSON))
		p.msgJSON = appendJSON(p.msgJSON, m)
	}
	p.encoded = len(msgs)
	p.tail = msgs[max(0, len(msgs)-len(p.results)):]
}

// resultsEncoded reports whether the step's tool results are the
// transcript's last messages (they are, unless a call failed), so that
// their encoding there serves tool_results too.
func (p *play) resultsEncoded() bool {
	n := len(p.results)
	if n == 0 || n > len(p.tail) || p.encoded != len(p.msgStart) {
		return false
	}
	for i, r := range p.results {
		m := p.tail[len(p.tail)-n+i]
		if m.Role != r.Role || m.Content != r.Content || m.ToolCallID != r.ToolCallID || m.Name != r.Name || len(m.ToolCalls) != 0 || len(r.ToolCalls) != 0 {
			return false
		}
	}
	return true
}

// observation encodes the current episode's StepResponse.
func (s *session) observation() json.RawMessage {
	p := s.play
	p.encodeMessages()
	b := make([]byte, 0, len(p.msgJSON)+len(s.env.toolsJSON)+512)
	b = append(b, `{"observation":{"episode_id":`...)
	b = appendString(b, p.id)
	b = append(b, `,"seed":`...)
	b = strconv.AppendInt(b, p.seed, 10)
	b = append(b, `,"step_count":`...)
	b = strconv.AppendInt(b, int64(p.steps), 10)
	b = append(b, `,"messages":[`...)
	b = append(b, p.msgJSON...)
	b = append(b, `],"tools":`...)
	b = append(b, s.env.toolsJSON...)
	b = append(b, `,"tool_results":`...)
	switch {
	case p.results == nil:
		b = append(b, `[]`...)
	case p.resultsEncoded():
		b = append(b, '[')
		b = append(b, p.msgJSON[p.msgStart[p.encoded-len(p.results)]:]...)
		b = append(b, ']')
	default:
		b = appendJSON(b, p.results)
	}
	b = append(b, `,"last_tool_result":`...)
	if n := len(p.results); n > 0 {
		b = appendString(b, p.results[n-1].Content)
	} else {
		b = append(b, `null`...)
	}
	if p.reward != nil {
		b = append(b, `,"reward_components":`...)
		if p.reward.Components == nil {
			b = append(b, `{}`...)
		} else {
			b = appendJSON(b, p.reward.Components)
		}
	}
	if p.reason != "" {
		b = append(b, `,"done_reason":`...)
		b = appendString(b, p.reason)
	}
	if p.err != "" {
		b = append(b, `,"error":`...)
		b = appendString(b, p.err)
	}
	b = append(b, `},"reward":`...)
	if p.reward != nil {
		b = appendJSON(b, p.reward.Value)
	} else {
		b = append(b, `null`...)
	}
	if p.done {
		b = append(b, `,"done":true}`...)
	} else {
		b = append(b, `,"done":false}`...)
	}
	return b
}

// frameJSON wraps data as a server frame {"type": typ, "data": data}.
func frameJSON(typ string, data []byte) []byte {
	b := make([]byte, 0, len(data)+32)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","data":`...)
	b = append(b, data...)
	return append(b, '}')
}
