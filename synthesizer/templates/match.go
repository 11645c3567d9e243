package templates

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/traceops/trace/schemas"
)

// MinMatchScore is the least keyword score Match accepts as a family.
const MinMatchScore = 0.35

// Other is the family a dictionary capability declares when none of the
// built-in families fits (`family: other`).
const Other = "other"

// Match finds the template family of a capability: its exact family name
// first (score 1), then keywords of each family in its name (weight 2) and
// its definition (weight 1), scored points / (points + 3). It returns ""
// when the best score is below MinMatchScore. why records the reason, for
// the environment's history.
func Match(capabilityName, definition string) (family string, score float64, why string) {
	name := normalize(capabilityName)
	if _, ok := Lookup(name); ok {
		return name, 1, fmt.Sprintf("the capability is named after the %s family", name)
	}
	nameText := " " + strings.ReplaceAll(name, "_", " ") + " "
	defText := " " + strings.ToLower(definition) + " "
	type cand struct {
		family         string
		points         int
		inName, inDefn []string
	}
	var cands []cand
	for _, f := range families {
		c := cand{family: f.Name}
		for _, k := range f.Keywords {
			if strings.Contains(nameText, k) {
				c.points += 2
				c.inName = append(c.inName, strings.TrimSpace(k))
			}
			if strings.Contains(defText, k) {
				c.points++
				c.inDefn = append(c.inDefn, strings.TrimSpace(k))
			}
		}
		cands = append(cands, c)
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return b.points - a.points })
	best := cands[0]
	score = float64(best.points) / float64(best.points+3)
	if score < MinMatchScore {
		return "", score, fmt.Sprintf("no family matches %q well enough (best %s at %.2f < %.2f)", capabilityName, best.family, score, MinMatchScore)
	}
	var parts []string
	if len(best.inName) > 0 {
		parts = append(parts, fmt.Sprintf("name has %s", quoteAll(best.inName)))
	}
	if len(best.inDefn) > 0 {
		parts = append(parts, fmt.Sprintf("definition has %s", quoteAll(best.inDefn)))
	}
	why = fmt.Sprintf("keywords of %s: %s (score %.2f", best.family, strings.Join(parts, "; "), score)
	if len(cands) > 1 && cands[1].points > 0 {
		why += fmt.Sprintf("; next %s at %.2f", cands[1].family, float64(cands[1].points)/float64(cands[1].points+3))
	}
	return best.family, score, why + ")"
}

// MatchDeclared is Match for a dictionary capability that may declare its
// family (`family:` in the dictionary file): a declared built-in family
// wins with score 1, a declared "other" means no template, and an empty
// or unknown declaration falls back to Match (an unknown one says so).
func MatchDeclared(declared, capabilityName, definition string) (family string, score float64, why string) {
	d := normalize(declared)
	switch {
	case d == "":
		return Match(capabilityName, definition)
	case d == Other:
		return "", 0, "the dictionary declares family other: no built-in template"
	}
	if _, ok := Lookup(d); ok {
		return d, 1, "the dictionary declares family " + d
	}
	f, s, w := Match(capabilityName, definition)
	return f, s, fmt.Sprintf("the dictionary declares unknown family %q; %s", declared, w)
}

func normalize(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	return strings.NewReplacer(" ", "_", "-", "_").Replace(s)
}

func quoteAll(ws []string) string {
	q := make([]string, len(ws))
	for i, w := range ws {
		q[i] = "'" + w + "'"
	}
	return strings.Join(q, ", ")
}

// ErrNoFamily is returned by ForRequest when the capability matches no
// built-in family: the request has to wait for a generation model.
var ErrNoFamily = errors.New("templates: the capability matches no built-in family")

// Matched records how a request's capability was matched to a family.
type Matched struct {
	Family string  `json:"family"`
	Score  float64 `json:"score"`
	Why    string  `json:"why"`
}

// ForRequest matches a synthesis request's capability to a family
// (declared is the dictionary's `family:` field, "" when it has none) and
// instantiates that family's template for the request's tools with the
// default knobs. It fails with ErrNoFamily (wrapped, with the reason) when
// no family matches, and with a *RoleError when the tools lack a role.
func ForRequest(req *schemas.SynthesisRequest, declared string) (*Template, Matched, error) {
	f, score, why := MatchDeclared(declared, req.Capability.Skill, req.Capability.Description)
	m := Matched{Family: f, Score: score, Why: why}
	if f == "" {
		return nil, m, fmt.Errorf("%w: %s: %s", ErrNoFamily, req.Capability.Skill, why)
	}
	tpl, err := Instantiate(f, req.Tools, Knobs{})
	return tpl, m, err
}
