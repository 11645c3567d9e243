package analyzer

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/traceops/trace/schemas"
)

// ImportScope names the cohort that TRACE run files are imported into.
type ImportScope struct {
	Environment       string
	AgentVersion      string
	DictionaryVersion uint32
}

// DictionaryFromCandidates turns a TRACE candidates file into a dictionary,
// so that imported labels have their definitions.
func DictionaryFromCandidates(sc ImportScope, cands []Candidate) *Dictionary {
	d := &Dictionary{Environment: sc.Environment, AgentVersion: sc.AgentVersion, Version: sc.DictionaryVersion, Source: "import"}
	for _, c := range cands {
		d.Capabilities = append(d.Capabilities, Capability{Name: c.Name, Definition: c.Description})
	}
	return d
}

// RunFileEvents turns run files into label events: run i of the files (in
// order) becomes run index i, and every (capability, id) of the six lists
// becomes one event whose outcome is the list's. The rollout id is the run
// file's trajectory id (e.g. "airline:12").
func RunFileEvents(sc ImportScope, runs []*RunFile) []schemas.LabelEvent {
	var out []schemas.LabelEvent
	for i, rf := range runs {
		for _, capName := range sortedKeys(rf.Labels) {
			l := rf.Labels[capName]
			for _, list := range []struct {
				ids     []string
				label   string
				success bool
			}{
				{l.LackingFailed, schemas.LabelLacking, false}, {l.PresentFailed, schemas.LabelPresent, false}, {l.NAFailed, schemas.LabelNA, false},
				{l.LackingPassed, schemas.LabelLacking, true}, {l.PresentPassed, schemas.LabelPresent, true}, {l.NAPassed, schemas.LabelNA, true},
			} {
				for _, id := range list.ids {
					reward := 0.0
					if list.success {
						reward = 1
					}
					out = append(out, schemas.LabelEvent{Schema: "label/v1", RolloutID: id, Environment: sc.Environment, AgentVersion: sc.AgentVersion,
						DictionaryVersion: sc.DictionaryVersion, Capability: capName, Run: uint16(i), Label: list.label,
						Success: list.success, Reward: reward, Source: schemas.SourceExternal})
				}
			}
		}
	}
	return out
}

// Validate checks an import scope; errors name the flag.
func (sc ImportScope) Validate() error {
	switch {
	case sc.Environment == "" || strings.IndexFunc(sc.Environment, unicode.IsSpace) >= 0:
		return fmt.Errorf("--environment: a non-empty name without spaces is required")
	case sc.AgentVersion == "":
		return fmt.Errorf("--agent-version is required")
	case sc.DictionaryVersion == 0:
		return fmt.Errorf("--dictionary-version must be >= 1")
	}
	return nil
}
