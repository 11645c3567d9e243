package llm

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/traceops/trace/schemas"
)

// StripFences removes one Markdown code fence (```json … ``` or ``` … ```)
// that wraps the whole answer, as small models often add, and surrounding
// white space. Nothing else is changed: an answer with prose around the
// fence, or an unterminated fence, is returned as is (trimmed) and fails
// validation.
func StripFences(s string) string {
	t := strings.TrimSpace(s)
	if !strings.HasPrefix(t, "```") {
		return t
	}
	nl := strings.IndexByte(t, '\n')
	if nl < 0 {
		return t
	}
	// The opening line is ``` optionally followed by one language tag.
	if tag := strings.TrimSpace(t[3:nl]); strings.ContainsAny(tag, " \t{[\"`") {
		return t
	}
	inner := strings.TrimSpace(t[nl+1:])
	if !strings.HasSuffix(inner, "```") {
		return t
	}
	inner = strings.TrimSuffix(inner, "```")
	if strings.Contains(inner, "```") {
		return t
	}
	return strings.TrimSpace(inner)
}

// maxJSONDepth bounds the nesting CheckDuplicateKeys walks.
const maxJSONDepth = 128

// CheckDuplicateKeys reports the first object in data that repeats a key,
// which encoding/json (and JSON Schema validators) silently collapse to the
// last value. data must be valid JSON.
func CheckDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkJSON(dec, "", 0)
}

func walkJSON(dec *json.Decoder, path string, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("JSON nested deeper than %d levels", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch d {
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			k, _ := kt.(string)
			if seen[k] {
				return fmt.Errorf("at %q: key %q appears twice", pathOrRoot(path), k)
			}
			seen[k] = true
			if err := walkJSON(dec, path+"/"+k, depth+1); err != nil {
				return err
			}
		}
	case '[':
		for i := 0; dec.More(); i++ {
			if err := walkJSON(dec, fmt.Sprintf("%s/%d", path, i), depth+1); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

func pathOrRoot(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

// compiledSchema is a request schema ready to validate answers.
type compiledSchema struct{ s *jsonschema.Schema }

func (c *compiledSchema) validate(content string) error {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(content))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	err = c.s.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	var msgs []string
	for _, v := range schemas.Violations(ve) {
		msgs = append(msgs, fmt.Sprintf("at %q: %s", v.Path, v.Msg))
	}
	if len(msgs) > 4 {
		msgs = append(msgs[:4], fmt.Sprintf("and %d more", len(msgs)-4))
	}
	return errors.New(strings.Join(msgs, "; "))
}

// schemaCache compiles each distinct request schema once.
type schemaCache struct {
	mu sync.Mutex
	m  map[[32]byte]*compiledSchema
}

// maxCachedSchemas bounds the cache; it is cleared when full (schemas are
// per dictionary or per discovery sample: few and cheap to recompile).
const maxCachedSchemas = 256

func (c *schemaCache) get(raw json.RawMessage) (*compiledSchema, error) {
	key := sha256.Sum256(raw)
	c.mu.Lock()
	if s, ok := c.m[key]; ok {
		c.mu.Unlock()
		return s, nil
	}
	c.mu.Unlock()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	comp := jsonschema.NewCompiler()
	const url = "trace:request-schema.json"
	if err := comp.AddResource(url, doc); err != nil {
		return nil, err
	}
	s, err := comp.Compile(url)
	if err != nil {
		return nil, err
	}
	cs := &compiledSchema{s: s}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedSchemas {
		c.m = map[[32]byte]*compiledSchema{}
	}
	c.m[key] = cs
	c.mu.Unlock()
	return cs, nil
}
