package envprog_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
)

// TestCompileParameters: a tool's parameters schema compiles when every
// reference stays inside it; a reference to anything else is refused,
// naming the tool, the ref and where it is, whatever subschema holds it.
// A "$ref" member of data (enum, const, default, an unknown keyword) and a
// property named "$ref" are not references.
func TestCompileParameters(t *testing.T) {
	cases := []struct {
		name, params string
		err          []string // substrings of the error; none: it compiles
	}{
		{name: "none", params: ``},
		{name: "null", params: `null`},
		{name: "plain", params: `{"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}`},
		{name: "local ref", params: `{"type": "object", "$defs": {"id": {"type": "string"}}, "properties": {"id": {"$ref": "#/$defs/id"}}}`},
		{name: "ref to the root", params: `{"type": "object", "properties": {"next": {"$ref": "#"}}}`},
		{name: "ref in data", params: `{"type": "object", "properties": {"a": {"enum": [{"$ref": "x.json"}], "default": {"$ref": "y.json"}}}, "x-note": {"$ref": "z.json"}}`},
		{name: "property named $ref", params: `{"type": "object", "properties": {"$ref": {"type": "string"}}}`},
		{name: "file ref at the root", params: `{"type": "object", "$ref": "file:///etc/passwd"}`,
			err: []string{`tool t: parameters: $ref "file:///etc/passwd" at # is not local`}},
		{name: "http ref in a property", params: `{"type": "object", "properties": {"id": {"$ref": "https://example.com/id.json"}}}`,
			err: []string{`$ref "https://example.com/id.json" at #/properties/id is not local`}},
		{name: "relative ref in items", params: `{"type": "object", "properties": {"ids": {"type": "array", "items": {"$ref": "id.json"}}}}`,
			err: []string{`$ref "id.json" at #/properties/ids/items is not local`}},
		{name: "ref in anyOf", params: `{"type": "object", "anyOf": [{"required": ["a"]}, {"$ref": "other.json#/b"}]}`,
			err: []string{`$ref "other.json#/b" at #/anyOf/1 is not local`}},
		{name: "ref in $defs", params: `{"type": "object", "$defs": {"a/b": {"$ref": "a.json"}}}`,
			err: []string{`$ref "a.json" at #/$defs/a~1b is not local`}},
		{name: "dynamic ref", params: `{"type": "object", "not": {"$dynamicRef": "urn:x"}}`,
			err: []string{`$dynamicRef "urn:x" at #/not is not local`}},
		{name: "empty ref", params: `{"type": "object", "$ref": ""}`, err: []string{`$ref "" at # is not local`}},
		{name: "unknown metaschema", params: `{"$schema": "https://example.com/schema", "type": "object"}`,
			err: []string{"tool t: parameters are not a JSON Schema", "https://example.com/schema is not loaded"}},
		{name: "local ref to nothing", params: `{"type": "object", "$ref": "#/$defs/none"}`,
			err: []string{"tool t: parameters are not a JSON Schema"}},
		{name: "not a schema", params: `{"type": "objekt"}`, err: []string{"tool t: parameters are not a JSON Schema"}},
		{name: "not JSON", params: `{"type":`, err: []string{"tool t: parameters:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sch, err := envprog.CompileParameters("t", json.RawMessage(tc.params))
			if len(tc.err) == 0 {
				if err != nil || sch == nil {
					t.Fatalf("%s: %v", tc.params, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s compiled, want an error", tc.params)
			}
			for _, m := range tc.err {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q lacks %q", err, m)
				}
			}
		})
	}
}
