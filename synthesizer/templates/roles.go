package templates

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/calibrate"
)

// A template needs tools in roles: a read tool of a record, a write tool on
// that record, a lookup of the user that lists their records. Roles are
// matched on the target's real tool schemas by name pattern and parameter
// names, and the template then uses those tools verbatim (names, parameter
// names and types, descriptions).

// Role names, as reported in a RoleError.
const (
	RoleRecordRead  = "record read"  // get_*/find_*/search_* taking exactly the record id
	RoleRecordWrite = "record write" // cancel_*/update_*/modify_*/book_*/return_*/exchange_* … on the record id
	RoleUserRead    = "user lookup"  // get_*/find_* taking exactly user_id
)

// RoleError says which role a template could not fill from the target's
// tools.
type RoleError struct {
	Family string
	Role   string
	Want   string   // what a tool in that role looks like
	Tools  []string // the target's tool names
}

func (e *RoleError) Error() string {
	return fmt.Sprintf("template %s: the target has no %s tool (%s); its tools are %s",
		e.Family, e.Role, e.Want, strings.Join(e.Tools, ", "))
}

var roleWant = map[string]string{
	RoleRecordRead:  "a get_*/find_*/search_* tool whose only required parameter is a record id such as reservation_id or order_id",
	RoleRecordWrite: "a cancel_*/update_*/modify_*/book_*/return_*/exchange_* tool taking the same record id, whose other required parameters are strings, numbers, booleans or enums",
	RoleUserRead:    "a get_*/find_* tool whose only required parameter is user_id",
}

// param is one parameter of a tool, as the template generates values for it.
type param struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Enum     []any  `json:"enum,omitempty"`
	Required bool   `json:"-"`
}

type tool struct {
	schema   schemas.Tool
	name     string
	params   map[string]param
	required []string
	scalar   bool // every required parameter is a scalar (no array or object)
}

func parseTools(tools []schemas.Tool) []tool {
	out := make([]tool, 0, len(tools))
	for _, t := range tools {
		var s struct {
			Properties map[string]struct {
				Type json.RawMessage `json:"type"`
				Enum []any           `json:"enum"`
			} `json:"properties"`
			Required []string `json:"required"`
		}
		_ = json.Unmarshal(t.Function.Parameters, &s)
		tl := tool{schema: t, name: t.Function.Name, params: map[string]param{}, required: s.Required, scalar: true}
		for name, p := range s.Properties {
			typ := calibrate.TypeOf(mustJSON(map[string]json.RawMessage{"type": p.Type}))
			tl.params[name] = param{Name: name, Type: typ, Enum: p.Enum, Required: slices.Contains(s.Required, name)}
		}
		for _, r := range s.Required {
			p, ok := tl.params[r]
			if !ok || !(p.Type == "string" || p.Type == "integer" || p.Type == "number" || p.Type == "boolean") {
				tl.scalar = false
			}
		}
		out = append(out, tl)
	}
	slices.SortFunc(out, func(a, b tool) int { return strings.Compare(a.name, b.name) })
	return out
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// onlyRequired says whether t's required parameters are exactly key.
func (t tool) onlyRequired(key string) bool {
	return len(t.required) == 1 && t.required[0] == key && t.params[key].Type == "string"
}

// toolset is the target's tools with the role lookups.
type toolset struct {
	family string
	all    []tool
}

func (ts toolset) names() []string {
	n := make([]string, len(ts.all))
	for i, t := range ts.all {
		n[i] = t.name
	}
	return n
}

func (ts toolset) missing(role string) error {
	return &RoleError{Family: ts.family, Role: role, Want: roleWant[role], Tools: ts.names()}
}

// recordRead is the read tool of records identified by key.
func (ts toolset) recordRead(key string) (tool, bool) {
	var best []tool
	for _, t := range ts.all {
		if calibrate.IsReadTool(t.name) && t.onlyRequired(key) {
			best = append(best, t)
		}
	}
	if len(best) == 0 {
		return tool{}, false
	}
	// get_reservation_details over search_*: a "details" read first.
	slices.SortStableFunc(best, func(a, b tool) int { return rankRead(a.name) - rankRead(b.name) })
	return best[0], true
}

func rankRead(name string) int {
	switch {
	case strings.HasPrefix(name, "get_") && strings.Contains(name, "detail"):
		return 0
	case strings.HasPrefix(name, "get_"):
		return 1
	case strings.HasPrefix(name, "find_"):
		return 2
	}
	return 3
}

// writePrefixOrder ranks write tools: a cancel is the simplest change to
// state, then edits, then bookings, returns and exchanges.
var writePrefixOrder = []string{"cancel_", "update_", "modify_", "set_", "change_", "book_", "return_", "exchange_"}

func rankWrite(t tool) int {
	for i, p := range writePrefixOrder {
		if strings.HasPrefix(t.name, p) {
			return i*100 + len(t.required)
		}
	}
	return len(writePrefixOrder)*100 + len(t.required)
}

// recordWrites are the write tools on records identified by key whose
// required parameters the template can fill, simplest first.
func (ts toolset) recordWrites(key string) []tool {
	var out []tool
	for _, t := range ts.all {
		p, ok := t.params[key]
		if !calibrate.IsWriteTool(t.name) || !ok || !p.Required || p.Type != "string" || !t.scalar {
			continue
		}
		if key != "user_id" && slices.Contains(t.required, "user_id") {
			continue // a user-level write (booking) is not a change of one record
		}
		out = append(out, t)
	}
	slices.SortStableFunc(out, func(a, b tool) int { return rankWrite(a) - rankWrite(b) })
	return out
}

func (ts toolset) userRead() (tool, bool) {
	return ts.recordRead("user_id")
}

// recordKeys are the candidate record keys, most specific first: the
// calibrate.RecordKeys except user_id, then any other *_id parameter of a
// write tool, sorted.
func (ts toolset) recordKeys() []string {
	keys := []string{}
	for _, k := range calibrate.RecordKeys {
		if k != "user_id" {
			keys = append(keys, k)
		}
	}
	var more []string
	for _, t := range ts.all {
		for name := range t.params {
			if strings.HasSuffix(name, "_id") && name != "user_id" && !slices.Contains(keys, name) && !slices.Contains(more, name) {
				more = append(more, name)
			}
		}
	}
	slices.Sort(more)
	return append(keys, more...)
}

// resolved is the tools a template instance uses.
type resolved struct {
	key    string
	read   *tool
	user   *tool
	writes []tool
}

// resolve finds, for the first record key that allows it, the roles a
// family needs: a record read (needRead), a user lookup (needUser) and up
// to maxWrites write tools (at least one when maxWrites > 0).
func (ts toolset) resolve(needRead, needUser bool, maxWrites int) (resolved, error) {
	var firstErr error
	var user *tool
	if needUser {
		u, ok := ts.userRead()
		if !ok {
			return resolved{}, ts.missing(RoleUserRead)
		}
		user = &u
	}
	for _, key := range ts.recordKeys() {
		r := resolved{key: key, user: user}
		if needRead {
			t, ok := ts.recordRead(key)
			if !ok {
				if firstErr == nil {
					firstErr = ts.missing(RoleRecordRead)
				}
				continue
			}
			r.read = &t
		}
		if maxWrites > 0 {
			w := ts.recordWrites(key)
			if len(w) == 0 {
				if firstErr == nil || needRead && r.read != nil {
					firstErr = ts.missing(RoleRecordWrite)
				}
				continue
			}
			r.writes = pickWrites(w, maxWrites)
		}
		return r, nil
	}
	if firstErr == nil {
		firstErr = ts.missing(RoleRecordRead)
	}
	return resolved{}, firstErr
}

// pickWrites takes up to n writes of distinct kinds (one cancel, one edit…).
func pickWrites(w []tool, n int) []tool {
	var out []tool
	seen := map[int]bool{}
	for _, t := range w {
		k := rankWrite(t) / 100
		if !seen[k] {
			seen[k] = true
			out = append(out, t)
		}
		if len(out) == n {
			break
		}
	}
	return out
}
