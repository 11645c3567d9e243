package router

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// chatBody is a chat completion request as the proxy reads it: the body
// scanned once (jsontext, validating) for the top-level members it needs,
// each kept as an offset range into the body, so that forwarding replaces
// the value of "model" and copies every other byte as the caller sent it
// (no decode and re-encode of messages, tools or anything else).
type chatBody struct {
	body     []byte
	open     int      // offset just after the opening '{'
	members  int      // top-level members
	models   [][2]int // the value of each top-level "model" (duplicates are all replaced)
	metadata []byte   // the raw value of "metadata", aliasing body
	stream   []byte   // the raw value of "stream"
	messages []byte   // the raw value of "messages"
}

var errNotObject = errors.New("body is not a JSON object")

// jsontext's defaults reject duplicate names and invalid UTF-8; a proxy
// passes both on as the caller sent them (encoding/json, which the proxy
// used before, accepted both too).
var scanOpts = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

// scanner is a pooled decoder with the buffer it reads: pointing the
// buffer at a body allocates nothing (jsontext reads a bytes.Buffer in
// place).
type scanner struct {
	dec *jsontext.Decoder
	buf bytes.Buffer
}

var scanners = sync.Pool{New: func() any {
	s := &scanner{}
	s.dec = jsontext.NewDecoder(&s.buf, scanOpts...)
	return s
}}

func getScanner(b []byte) *scanner {
	s := scanners.Get().(*scanner)
	s.buf = *bytes.NewBuffer(b)
	s.dec.Reset(&s.buf, scanOpts...)
	return s
}

func (s *scanner) put() {
	s.buf = bytes.Buffer{} // drop the reference to the body
	s.dec.Reset(&s.buf, scanOpts...)
	scanners.Put(s)
}

// scanChat validates body as one JSON object and finds its members.
func scanChat(body []byte) (chatBody, error) {
	c := chatBody{body: body}
	s := getScanner(body)
	defer s.put()
	dec := s.dec
	tok, err := dec.ReadToken()
	if err != nil || tok.Kind() != '{' {
		return c, errNotObject
	}
	c.open = int(dec.InputOffset())
	for dec.PeekKind() != '}' {
		name, err := dec.ReadValue()
		if err != nil {
			return c, errNotObject
		}
		c.members++
		key := name[1 : len(name)-1]
		if bytes.IndexByte(key, '\\') >= 0 { // an escaped name: compare it unescaped
			if key, err = jsontext.AppendUnquote(nil, name); err != nil {
				return c, errNotObject
			}
		}
		var dst *[]byte
		isModel := false
		switch string(key) { // no allocation: the compiler compares in place
		case "model":
			isModel = true
		case "metadata":
			dst = &c.metadata
		case "stream":
			dst = &c.stream
		case "messages":
			dst = &c.messages
		}
		if dst == nil && !isModel {
			if err := dec.SkipValue(); err != nil {
				return c, errNotObject
			}
			continue
		}
		v, err := dec.ReadValue()
		if err != nil {
			return c, errNotObject
		}
		end := int(dec.InputOffset())
		start := end - len(v)
		if isModel {
			c.models = append(c.models, [2]int{start, end})
		} else {
			*dst = body[start:end:end]
		}
	}
	if _, err := dec.ReadToken(); err != nil { // the closing '}'
		return c, errNotObject
	}
	if _, err := dec.ReadToken(); err != io.EOF { // nothing after the object
		return c, errNotObject
	}
	return c, nil
}

// withModel is the body with every top-level "model" set to model (a
// JSON string), or with "model" added first when the caller sent none;
// every other byte is the caller's.
func (c chatBody) withModel(model []byte) []byte {
	if len(c.models) == 0 {
		out := make([]byte, 0, len(c.body)+len(model)+10)
		out = append(out, c.body[:c.open]...)
		out = append(out, `"model":`...)
		out = append(out, model...)
		if c.members > 0 {
			out = append(out, ',')
		}
		return append(out, c.body[c.open:]...)
	}
	n := len(c.body)
	for _, m := range c.models {
		n += len(model) - (m[1] - m[0])
	}
	out := make([]byte, 0, n)
	prev := 0
	for _, m := range c.models {
		out = append(out, c.body[prev:m[0]]...)
		out = append(out, model...)
		prev = m[1]
	}
	return append(out, c.body[prev:]...)
}

// readMetadata reads the routing fields of a request's metadata as
// encoding/json would decode them into metadata (names matched without
// regard to case, the last of duplicates wins, only strings count, and
// anything else, metadata that is no object included, leaves a field
// empty), in one pass that allocates only the strings it keeps.
func readMetadata(raw []byte) metadata {
	var md metadata
	if len(raw) == 0 {
		return md
	}
	s := getScanner(raw)
	defer s.put()
	dec := s.dec
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return metadata{}
	}
	var unq []byte
	for dec.PeekKind() != '}' {
		name, err := dec.ReadValue()
		if err != nil {
			return metadata{}
		}
		key := name[1 : len(name)-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			// An escaped name fails to unquote only with invalid UTF-8 (the
			// body is valid JSON), and then matches none of the names.
			unq, err = jsontext.AppendUnquote(unq[:0], name)
			key = unq
			if err != nil {
				key = nil
			}
		}
		var dst *string
		switch {
		case bytes.EqualFold(key, []byte("conversation_id")):
			dst = &md.ConversationID
		case bytes.EqualFold(key, []byte("environment")):
			dst = &md.Environment
		case bytes.EqualFold(key, []byte("agent_version")):
			dst = &md.AgentVersion
		}
		if dst == nil || dec.PeekKind() != '"' {
			if err := dec.SkipValue(); err != nil {
				return metadata{}
			}
			continue
		}
		tok, err := dec.ReadToken()
		if err != nil {
			return metadata{}
		}
		*dst = tok.String()
		if !utf8.ValidString(*dst) { // as encoding/json: each invalid byte becomes U+FFFD
			*dst = strings.Map(func(r rune) rune { return r }, *dst)
		}
	}
	return md
}
