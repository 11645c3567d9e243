package envserver

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/openenv"
)

// The observation is encoded by hand, field for field as
// openenv.StepResponse and openenv.Observation declare them, byte for byte
// as encoding/json would (tests compare the two): the tools are encoded
// once per environment and the transcript, which only grows, once per
// message, so that a step costs the encoding of what it added rather than
// of the whole episode. Over WebSocket the frame is built in a buffer the
// session reuses from step to step (see session.observation).

// appendJSON appends v's JSON encoding.
func appendJSON(b []byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		// Only strings, numbers and maps of them are encoded here.
		panic(err)
	}
	return append(b, j...)
}

// htmlSafe[c] is whether encoding/json writes the ASCII byte c as itself
// in a string (it escapes control characters, '"', '\\' and, HTML-safe,
// '<', '>' and '&').
var htmlSafe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, exactly as json.Marshal writes
// it (HTML-safe escapes, invalid UTF-8 as U+FFFD, U+2028 and U+2029
// escaped), without its reflection and buffer copies.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if htmlSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendMessage appends m's encoding as an openenv.ChatMessage (what
// chatMessages makes of it, system holding the hint when there is one) and
// returns where its content's encoding is in b.
func appendMessage(b []byte, m envprog.Message, hint string) ([]byte, [2]int) {
	b = append(b, `{"role":`...)
	b = appendString(b, m.Role)
	b = append(b, `,"content":`...)
	at := len(b)
	if hint != "" {
		b = appendString(b, m.Content+"\n\n"+envprog.HintOpen+hint+envprog.HintClose)
	} else {
		b = appendString(b, m.Content)
	}
	content := [2]int{at, len(b)}
	if len(m.ToolCalls) > 0 {
		b = append(b, `,"tool_calls":[`...)
		for i, tc := range m.ToolCalls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendString(b, tc.ID)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = appendString(b, tc.Name)
			b = append(b, `,"arguments":`...)
			if len(tc.Arguments) == 0 {
				b = append(b, `"{}"`...)
			} else {
				b = appendString(b, string(tc.Arguments))
			}
			b = append(b, `}}`...)
		}
		b = append(b, ']')
	}
	if m.ToolCallID != "" {
		b = append(b, `,"tool_call_id":`...)
		b = appendString(b, m.ToolCallID)
	}
	if m.Name != "" {
		b = append(b, `,"name":`...)
		b = appendString(b, m.Name)
	}
	return append(b, '}'), content
}

// messageViewer is an Episode that shows its transcript from message i on
// without copying it (envprog's episodes do).
type messageViewer interface {
	MessagesFrom(i int) []envprog.Message
}

// encodeMessages brings p's encoded transcript up to date.
func (p *play) encodeMessages() {
	var msgs []envprog.Message // the messages not encoded yet
	if v, ok := p.ep.(messageViewer); ok {
		msgs = v.MessagesFrom(p.encoded)
	} else {
		all := p.ep.Messages()
		msgs = all[min(p.encoded, len(all)):]
	}
	for j, m := range msgs {
		i := p.encoded + j
		hint := ""
		if i == 0 && p.hinted && m.Role == "system" {
			hint = p.hint
		}
		if i > 0 {
			p.msgJSON = append(p.msgJSON, ',')
		}
		p.msgStart = append(p.msgStart, len(p.msgJSON))
		p.msgJSON, p.lastContent = appendMessage(p.msgJSON, m, hint)
	}
	p.encoded += len(msgs)
	// The step's results are among its new messages (resultsEncoded
	// checks that they are the last ones).
	p.tail = msgs[max(0, len(msgs)-len(p.results)):]
}

// resultsEncoded reports whether the step's tool results are the
// transcript's last messages (they are, unless a call failed), so that
// their encoding there serves tool_results (and the last one's content
// last_tool_result) too.
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

// obsFrame is what an observation is wrapped in over WebSocket.
const obsFrame = `{"type":"` + openenv.FrameObservation + `","data":`

// observation encodes the current episode's StepResponse. A WebSocket
// session's connection handles one frame at a time and has sent each
// answer before it reads the next frame, so for it the observation is
// built inside its frame, in a buffer the session reuses (see framed):
// a step allocates and copies nothing of the kilobytes it sends.
//
// An observation over env.max_observation_bytes is not sent (see
// oversized); its length is compared once it is built, and a transcript
// whose encoding alone is over the limit is not built into one.
func (s *session) observation() (json.RawMessage, *openenv.Error) {
	p := s.play
	p.encodeMessages()
	limit := s.env.srv.cfg.MaxObservationBytes
	if n := len(p.msgJSON); n > limit {
		return nil, s.oversized(n, true)
	}
	if s.transport == "ws" {
		b := append(s.frameBuf[:0], obsFrame...)
		b = s.appendObservation(b)
		if n := len(b) - len(obsFrame); n > limit {
			return nil, s.oversized(n, false)
		}
		s.frameBuf = append(b, '}')
		return b[len(obsFrame):], nil
	}
	b := s.appendObservation(make([]byte, 0, len(p.msgJSON)+len(s.env.toolsJSON)+512))
	if len(b) > limit {
		return nil, s.oversized(len(b), false)
	}
	return b, nil
}

// framed returns obs as a WebSocket observation frame: the session's frame
// buffer when obs is the observation just built there.
func (s *session) framed(obs json.RawMessage) []byte {
	if n := len(obs); n > 0 && len(s.frameBuf) == len(obsFrame)+n+1 && &s.frameBuf[len(obsFrame)] == &obs[0] {
		return s.frameBuf
	}
	return frameJSON(openenv.FrameObservation, obs)
}

func (s *session) appendObservation(b []byte) []byte {
	p := s.play
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
	encoded := p.resultsEncoded()
	switch {
	case p.results == nil:
		b = append(b, `[]`...)
	case encoded:
		b = append(b, '[')
		b = append(b, p.msgJSON[p.msgStart[p.encoded-len(p.results)]:]...)
		b = append(b, ']')
	default:
		b = appendJSON(b, p.results)
	}
	b = append(b, `,"last_tool_result":`...)
	switch n := len(p.results); {
	case n > 0 && encoded:
		b = append(b, p.msgJSON[p.lastContent[0]:p.lastContent[1]]...)
	case n > 0:
		b = appendString(b, p.results[n-1].Content)
	default:
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
