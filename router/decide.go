package router

import (
	"cmp"
	"slices"
	"strings"
)

// Weight is one adapter of a top-p set with its renormalised weight.
type Weight struct {
	Adapter string  `json:"adapter"`
	Label   string  `json:"label"`
	Weight  float64 `json:"weight"`
}

// Choice is what the decision rule picked: an adapter ("" = the base
// model) and, with top-p, the set of adapters and their weights.
type Choice struct {
	Label   string // the chosen label ("" when routed without probabilities)
	Adapter string
	// Capability of the chosen adapter ("" for the base model).
	Capability string
	// Weights is the top-p set, renormalised to sum 1, highest first (the
	// served adapter is Weights[0]); nil for the base model.
	Weights []Weight
}

// Decide applies TRACE's rule to label probabilities. If "no adapter" has
// the highest probability the base model is chosen. Otherwise the top
// adapter is served; with topP in (0, 1] the smallest set of adapters, by
// descending probability, whose cumulative probability reaches topP is
// recorded as weights renormalised over the set (the "no adapter" label
// is not part of the set: it is the base model, not an adapter to blend).
// topP <= 0 records the top adapter alone. A tie with "no adapter" at the
// top is the base model ("no adapter" has the highest probability, shared);
// ties among adapters break by label order, so the rule is deterministic.
func Decide(labels []Label, probs map[string]float64, topP float64) Choice {
	order := slices.Clone(labels)
	slices.SortStableFunc(order, func(a, b Label) int {
		return cmp.Or(cmp.Compare(probs[b.Name], probs[a.Name]), boolFirst(a.NoAdapter, b.NoAdapter), strings.Compare(a.Name, b.Name))
	})
	if len(order) == 0 || order[0].NoAdapter {
		return Choice{Label: firstName(order)}
	}
	top := order[0]
	c := Choice{Label: top.Name, Adapter: top.Candidate.Adapter, Capability: top.Candidate.Capability}
	// Walk the labels by descending probability until the cumulative
	// probability reaches p; the set's adapters are recorded.
	var set []Label
	cum := 0.0
	for _, l := range order {
		if topP <= 0 && len(set) > 0 {
			break
		}
		if !l.NoAdapter && (len(set) == 0 || probs[l.Name] > 0) {
			set = append(set, l)
		}
		cum += probs[l.Name]
		if cum >= topP-1e-12 {
			break
		}
	}
	total := 0.0
	for _, l := range set {
		total += probs[l.Name]
	}
	for _, l := range set {
		w := 1.0
		if total > 0 {
			w = probs[l.Name] / total
		}
		c.Weights = append(c.Weights, Weight{Adapter: l.Candidate.Adapter, Label: l.Name, Weight: w})
	}
	return c
}

// boolFirst orders true before false.
func boolFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

func firstName(ls []Label) string {
	if len(ls) == 0 {
		return ""
	}
	return ls[0].Name
}
