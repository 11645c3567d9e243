package envprog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// CompileParameters compiles a tool's parameters schema (empty or null:
// an object without properties) the one way trace uses it: a program's
// load refuses a tool whose schema does not compile (so validation fails
// the program, naming the tool, before it can become an environment), and
// the environment server validates the tool's arguments with the schema
// it returns. A tool's schema comes from a program (and the target's from
// rollouts), so it loads no other document: a "$ref" (or "$dynamicRef",
// "$recursiveRef") that does not start with "#" is refused, naming the
// ref and where it is, and the compiler's loader loads nothing, since
// jsonschema's default one reads file:// URLs (a "$ref" made the server
// read a local file and name what it held in validation messages).
func CompileParameters(tool string, params json.RawMessage) (*jsonschema.Schema, error) {
	if len(params) == 0 || string(params) == "null" {
		params = json.RawMessage(`{"type":"object","properties":{}}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(params))
	if err != nil {
		return nil, fmt.Errorf("tool %s: parameters: %w", tool, err)
	}
	if ref, at, ok := externalRef(doc, "#"); ok {
		return nil, fmt.Errorf("tool %s: parameters: %s %q at %s is not local: a tool's parameters schema may only refer inside itself (\"#/$defs/…\"); no other document is loaded", tool, ref.keyword, ref.value, at)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noExternalRefs{})
	const url = "mem://parameters.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("tool %s: parameters: %w", tool, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("tool %s: parameters are not a JSON Schema: %w", tool, err)
	}
	return sch, nil
}

// noExternalRefs is the schema compiler's loader: it loads nothing
// (externalRef names a plain "$ref" first; this stops anything else that
// would load a document, such as an unknown "$schema").
type noExternalRefs struct{}

func (noExternalRefs) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s is not loaded: a tool's parameters schema may only refer inside itself", url)
}

// refKeywords are the keywords that refer to another schema by URI.
var refKeywords = []string{"$ref", "$dynamicRef", "$recursiveRef"}

// subschemaIn are the keywords whose values are subschemas (jsonschema's
// subschema locations of drafts 4 to 2020-12): true for a map of them
// (properties/*), false for one or a list (not, allOf/[], items and
// items/[]). A "$ref" anywhere else (inside "enum", "const", "default",
// an unknown keyword) is data, which the compiler never follows.
var subschemaIn = map[string]bool{
	"properties": true, "patternProperties": true, "definitions": true, "$defs": true,
	"dependencies": true, "dependentSchemas": true,
	"not": false, "allOf": false, "anyOf": false, "oneOf": false, "additionalProperties": false,
	"items": false, "prefixItems": false, "additionalItems": false, "propertyNames": false, "contains": false,
	"if": false, "then": false, "else": false, "unevaluatedProperties": false, "unevaluatedItems": false,
	"contentSchema": false,
}

type ref struct{ keyword, value string }

// externalRef finds the first reference of schema v (at JSON pointer at,
// in keyword order) whose value does not start with "#".
func externalRef(v any, at string) (ref, string, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		return ref{}, "", false // true, false, or not a schema (the compiler says so)
	}
	for _, k := range refKeywords {
		if s, ok := obj[k].(string); ok && !strings.HasPrefix(s, "#") {
			return ref{k, s}, at, true
		}
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		isMap, sub := subschemaIn[k]
		if !sub {
			continue
		}
		here := at + "/" + pointerToken(k)
		switch val := obj[k].(type) {
		case map[string]any:
			if !isMap {
				if r, a, ok := externalRef(val, here); ok {
					return r, a, true
				}
				continue
			}
			names := make([]string, 0, len(val))
			for n := range val {
				names = append(names, n)
			}
			slices.Sort(names)
			for _, n := range names {
				if r, a, ok := externalRef(val[n], here+"/"+pointerToken(n)); ok {
					return r, a, true
				}
			}
		case []any:
			for i, s := range val {
				if r, a, ok := externalRef(s, fmt.Sprintf("%s/%d", here, i)); ok {
					return r, a, true
				}
			}
		}
	}
	return ref{}, "", false
}

// pointerToken escapes a JSON pointer's token (RFC 6901).
func pointerToken(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}
