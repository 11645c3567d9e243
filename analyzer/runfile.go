package analyzer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// SixLists are the labels of one capability in one TRACE run file: every
// trajectory sits in exactly one list, which gives its label and outcome.
type SixLists struct {
	LackingFailed []string `json:"lacking_failed"`
	PresentFailed []string `json:"present_failed"`
	NAFailed      []string `json:"na_failed"`
	LackingPassed []string `json:"lacking_passed"`
	PresentPassed []string `json:"present_passed"`
	NAPassed      []string `json:"na_passed"`
}

// Counts returns the list lengths.
func (s SixLists) Counts() Counts {
	return Counts{len(s.LackingFailed), len(s.PresentFailed), len(s.NAFailed),
		len(s.LackingPassed), len(s.PresentPassed), len(s.NAPassed)}
}

// RunFile is one labeling run in the TRACE release's six-list schema
// (pipeline/run_NN.json).
type RunFile struct {
	Name    string `json:"-"` // file name, for errors
	Attempt int    `json:"attempt"`
	Totals  struct {
		TotalFailed int `json:"total_failed"`
		TotalPassed int `json:"total_passed"`
	} `json:"totals"`
	Labels map[string]SixLists `json:"labels"`
}

// trimBOM drops a UTF-8 byte order mark at the start of a file (RFC 8259
// lets a parser ignore it; files saved by Windows tools often have one).
func trimBOM(data []byte) []byte { return bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) }

// ParseRunFile decodes and validates a run file. name is used in errors.
func ParseRunFile(name string, data []byte) (*RunFile, error) {
	var rf RunFile
	if err := json.Unmarshal(trimBOM(data), &rf); err != nil {
		return nil, fmt.Errorf("%s: not a TRACE run file: %w", name, err)
	}
	rf.Name = name
	if err := rf.Validate(); err != nil {
		return nil, err
	}
	return &rf, nil
}

// Validate checks the run file's invariants: every (capability, id) pair sits
// in exactly one list, each capability's failed and passed lists add up to the
// totals, and an id is failed (or passed) for every capability alike.
func (rf *RunFile) Validate() error {
	if len(rf.Labels) == 0 {
		return fmt.Errorf("%s: no labels", rf.Name)
	}
	if rf.Totals.TotalFailed < 0 || rf.Totals.TotalPassed < 0 {
		return fmt.Errorf("%s: negative totals", rf.Name)
	}
	outcome := map[string]bool{} // id -> failed
	for _, cap := range sortedKeys(rf.Labels) {
		l := rf.Labels[cap]
		seen := map[string]string{}
		lists := []struct {
			name   string
			ids    []string
			failed bool
		}{
			{"lacking_failed", l.LackingFailed, true}, {"present_failed", l.PresentFailed, true}, {"na_failed", l.NAFailed, true},
			{"lacking_passed", l.LackingPassed, false}, {"present_passed", l.PresentPassed, false}, {"na_passed", l.NAPassed, false},
		}
		for _, list := range lists {
			for _, id := range list.ids {
				if id == "" {
					return fmt.Errorf("%s: capability %q: empty id in %s", rf.Name, cap, list.name)
				}
				if prev, dup := seen[id]; dup && prev == list.name {
					return fmt.Errorf("%s: capability %q: id %q is in %s twice", rf.Name, cap, id, list.name)
				} else if dup {
					return fmt.Errorf("%s: capability %q: id %q is in both %s and %s", rf.Name, cap, id, prev, list.name)
				}
				seen[id] = list.name
				if f, ok := outcome[id]; ok && f != list.failed {
					return fmt.Errorf("%s: capability %q: id %q is %s here but %s for another capability",
						rf.Name, cap, id, outcomeWord(list.failed), outcomeWord(f))
				}
				outcome[id] = list.failed
			}
		}
		c := l.Counts()
		if c.Failed() != rf.Totals.TotalFailed {
			return fmt.Errorf("%s: capability %q: failed lists hold %d ids, totals.total_failed is %d", rf.Name, cap, c.Failed(), rf.Totals.TotalFailed)
		}
		if c.Passed() != rf.Totals.TotalPassed {
			return fmt.Errorf("%s: capability %q: passed lists hold %d ids, totals.total_passed is %d", rf.Name, cap, c.Passed(), rf.Totals.TotalPassed)
		}
	}
	return nil
}

func outcomeWord(failed bool) string {
	if failed {
		return "failed"
	}
	return "passed"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Candidate is one proposed capability (pipeline/candidate_capabilities.json).
type Candidate struct {
	Name                string            `json:"name"`
	Description         string            `json:"description"`
	ExampleTrajectories []json.RawMessage `json:"example_trajectories,omitempty"`
}

// ParseCandidates reads {"candidates": [...]}.
func ParseCandidates(name string, data []byte) ([]Candidate, error) {
	var doc struct {
		Candidates []Candidate `json:"candidates"`
	}
	if err := json.Unmarshal(trimBOM(data), &doc); err != nil {
		return nil, fmt.Errorf("%s: not a candidates file: %w", name, err)
	}
	if len(doc.Candidates) == 0 {
		return nil, fmt.Errorf("%s: no candidates", name)
	}
	seen := map[string]bool{}
	for i, c := range doc.Candidates {
		if c.Name == "" {
			return nil, fmt.Errorf("%s: candidate %d has no name", name, i)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("%s: candidate %q appears twice", name, c.Name)
		}
		seen[c.Name] = true
	}
	return doc.Candidates, nil
}

// LoadRuns reads every run file matching the glob, sorted by file name, and
// validates them. Every candidate must be labeled in every run.
func LoadRuns(glob string) ([]*RunFile, error) {
	paths, err := filepath.Glob(glob)
	if err != nil {
		return nil, fmt.Errorf("--runs %q: %w", glob, err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("--runs %q matches no file", glob)
	}
	sort.Strings(paths)
	runs := make([]*RunFile, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		rf, err := ParseRunFile(p, data)
		if err != nil {
			return nil, err
		}
		runs = append(runs, rf)
	}
	return runs, nil
}

// RunsToInputs assembles the selection input for the candidates from run
// files. A candidate missing from a run is an error naming file and capability.
func RunsToInputs(cands []Candidate, runs []*RunFile) ([]CapabilityRuns, error) {
	out := make([]CapabilityRuns, 0, len(cands))
	for _, c := range cands {
		cr := CapabilityRuns{Name: c.Name, Description: c.Description}
		for _, rf := range runs {
			l, ok := rf.Labels[c.Name]
			if !ok {
				return nil, fmt.Errorf("%s: capability %q: not labeled in this run", rf.Name, c.Name)
			}
			cr.Runs = append(cr.Runs, RunInput{Counts: l.Counts(), LackingFailedIDs: l.LackingFailed})
		}
		out = append(out, cr)
	}
	return out, nil
}
