package calibrate

import (
	"encoding/json"
	"strings"

	"github.com/traceops/trace/analyzer"
)

// ReadPrefixes are the name prefixes of tools that read a record.
var ReadPrefixes = []string{"get_", "find_", "search_", "list_", "lookup_", "fetch_", "check_"}

// IsWriteTool says whether a tool changes the environment's state: its name
// starts with one of the rules labeler's write prefixes
// (analyzer.DefaultWritePrefixes), the same test the detectors use.
func IsWriteTool(name string) bool {
	for _, p := range analyzer.DefaultWritePrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// IsReadTool says whether a tool reads a record (get_*, find_*, search_*, …).
func IsReadTool(name string) bool {
	for _, p := range ReadPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// IsErrorResult says whether a tool result reports an error the way τ²
// tools and environment programs do: text starting with "Error", or a JSON
// object with an "error" member.
func IsErrorResult(content string) bool {
	c := strings.TrimSpace(content)
	if strings.HasPrefix(c, "Error") || strings.HasPrefix(c, "error:") {
		return true
	}
	if strings.HasPrefix(c, "{") {
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(c), &obj) == nil {
			if e, ok := obj["error"]; ok && string(e) != "null" && string(e) != "false" && string(e) != `""` {
				return true
			}
		}
	}
	return false
}

// RecordKeys are the argument names that identify the record a call
// reads or changes, most specific first; any other "*_id" argument comes
// after them.
var RecordKeys = []string{"reservation_id", "order_id", "user_id"}
