package schemas

import (
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Violation is one failed keyword of a JSON Schema validation: a leaf of
// jsonschema's error tree.
type Violation struct {
	Path string // the instance location as a JSON Pointer (RFC 6901; "/" for the root)
	Rule string // the failed keyword (jsonschema KeywordPath, e.g. "required")
	Msg  string // jsonschema's English message
}

// Violations flattens a validation error into its leaves, ordered by
// instance location (stably, so messages are deterministic). It is the one
// flattening of schema errors in trace: schemas.Validate and internal/llm's
// answer validation both use it.
func Violations(e *jsonschema.ValidationError) []Violation {
	leaves := leafErrors(e, nil)
	sort.SliceStable(leaves, func(i, j int) bool {
		return strings.Join(leaves[i].InstanceLocation, "/") < strings.Join(leaves[j].InstanceLocation, "/")
	})
	out := make([]Violation, len(leaves))
	for i, l := range leaves {
		out[i] = Violation{
			Path: Pointer(l.InstanceLocation),
			Rule: strings.Join(l.ErrorKind.KeywordPath(), "/"),
			Msg:  l.ErrorKind.LocalizedString(printer),
		}
	}
	return out
}

func leafErrors(e *jsonschema.ValidationError, out []*jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return append(out, e)
	}
	for _, c := range e.Causes {
		out = leafErrors(c, out)
	}
	return out
}

// Pointer renders instance-location tokens as a JSON Pointer (RFC 6901),
// escaping "~" as "~0" and "/" as "~1" in each token; no tokens (the root)
// is "/".
func Pointer(tokens []string) string {
	if len(tokens) == 0 {
		return "/"
	}
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		b.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return b.String()
}
