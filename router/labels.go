package router

import (
	"cmp"
	"slices"
	"strings"
)

// Candidate is an active adapter the router may choose.
type Candidate struct {
	// Adapter is the adapter's served name: the "model" of a request that
	// uses it (vLLM multi-LoRA).
	Adapter    string
	Capability string
	// Description is the capability's definition shown to the classifier
	// (from the dictionary; the capability name when none is known).
	Description string
}

// Label is one label of a classification: a letter and the candidate it
// stands for (Candidate zero for the "no adapter" label).
type Label struct {
	Name      string
	Candidate Candidate
	NoAdapter bool
}

// NoAdapterCapability is the capability shown for the "no adapter" label
// in responses and records.
const NoAdapterCapability = "none"

// MaxCandidates is the number of adapters one classification can show:
// labels are the letters A–Y, and one more letter is "no adapter".
const MaxCandidates = 25

// AssignLabels gives the candidates labels A, B, C, … in a stable order
// (by capability, then adapter name, so that a conversation that is routed
// again sees the same letters) and the next letter to "no adapter". Beyond
// MaxCandidates the rest are dropped and returned.
func AssignLabels(cands []Candidate) (labels []Label, dropped []Candidate) {
	cs := slices.Clone(cands)
	slices.SortFunc(cs, func(a, b Candidate) int {
		return cmp.Or(strings.Compare(a.Capability, b.Capability), strings.Compare(a.Adapter, b.Adapter))
	})
	cs = slices.CompactFunc(cs, func(a, b Candidate) bool { return a.Adapter == b.Adapter })
	if len(cs) > MaxCandidates {
		cs, dropped = cs[:MaxCandidates], cs[MaxCandidates:]
	}
	for i, c := range cs {
		labels = append(labels, Label{Name: string(rune('A' + i)), Candidate: c})
	}
	labels = append(labels, Label{Name: string(rune('A' + len(cs))), NoAdapter: true})
	return labels, dropped
}

// LabelNames lists the labels' letters in order.
func LabelNames(labels []Label) []string {
	out := make([]string, len(labels))
	for i, l := range labels {
		out[i] = l.Name
	}
	return out
}

// Capability is what a label stands for in responses ("none" for no adapter).
func (l Label) Capability() string {
	if l.NoAdapter {
		return NoAdapterCapability
	}
	return l.Candidate.Capability
}
