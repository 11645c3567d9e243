package calibrate

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
)

// Scripted policies of known skill, for tests and for checking an
// environment's calibration machinery without a model. None of them is a
// model: their summaries are marked Simulated. All are deterministic per
// (seed, rollout) and stateless (safe for concurrent use): each turn
// recomputes the rollout's plan from the seed, the rollout index and the
// reference, and plays its Index-th entry.

// RolloutRNG is the deterministic generator of one (seed, rollout, purpose).
func RolloutRNG(seed int64, rollout int, salt uint64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), uint64(rollout)<<20^salt))
}

// planned plays plan[t.Index], and a final answer after the plan's end.
func Planned(plan []envprog.Action, t Turn) envprog.Action {
	if t.Index < len(plan) {
		return plan[t.Index]
	}
	return envprog.Action{Content: "I have done what I could."}
}

// OraclePolicy plays the environment's reference solution. An environment
// it solves on every seed is, by construction, too easy for calibration:
// it is the upper bound of every band.
type OraclePolicy struct{}

// Act plays the reference's next turn.
func (OraclePolicy) Act(ctx context.Context, t Turn) (envprog.Action, error) {
	ref, err := t.Reference(ctx)
	if err != nil {
		return envprog.Action{}, err
	}
	if ref == nil {
		return envprog.Action{}, fmt.Errorf("scripted-oracle: the environment has no reference()")
	}
	return Planned(ref, t), nil
}

func (OraclePolicy) String() string  { return "scripted-oracle" }
func (OraclePolicy) Simulated() bool { return true }

// RandomPolicy makes 0..MaxCalls tool calls of random tools with random,
// type-correct arguments (drawn from each tool's JSON Schema), then gives a
// random final answer. MaxCalls 0 means 6.
type RandomPolicy struct {
	MaxCalls int
}

const saltRandom = 0x72616e64 // "rand"

// Act plays the random rollout's next turn.
func (p RandomPolicy) Act(_ context.Context, t Turn) (envprog.Action, error) {
	return Planned(p.plan(t.Seed, t.Rollout, t.Tools), t), nil
}

func (p RandomPolicy) plan(seed int64, rollout int, tools []schemas.Tool) []envprog.Action {
	maxCalls := p.MaxCalls
	if maxCalls <= 0 {
		maxCalls = 6
	}
	rng := RolloutRNG(seed, rollout, saltRandom)
	n := rng.IntN(maxCalls + 1)
	plan := make([]envprog.Action, 0, n+1)
	for i := 0; i < n && len(tools) > 0; i++ {
		plan = append(plan, envprog.Action{ToolCalls: []envprog.ToolCall{RandomCall(rng, tools, fmt.Sprintf("rnd-%d", i))}})
	}
	return append(plan, envprog.Action{Content: randomWords(rng, 3+rng.IntN(8))})
}

func (p RandomPolicy) String() string { return "scripted-random" }
func (RandomPolicy) Simulated() bool  { return true }

// SkillPolicy solves about Skill of the instances: each rollout plays the
// reference with probability Skill; otherwise it is a botched rollout that
// keeps each reference turn (the final answer included) with probability
// Keep and otherwise replaces it by a random tool call or skips it, so
// botched rollouts earn some partial credit but rarely all of it. Keep 0
// means 0.25.
type SkillPolicy struct {
	Skill float64
	Keep  float64
}

const saltSkill = 0x736b696c // "skil"

// Act plays the rollout's next turn.
func (p SkillPolicy) Act(ctx context.Context, t Turn) (envprog.Action, error) {
	ref, err := t.Reference(ctx)
	if err != nil {
		return envprog.Action{}, err
	}
	if ref == nil {
		return envprog.Action{}, fmt.Errorf("%s: the environment has no reference()", p)
	}
	keep := p.Keep
	if keep <= 0 {
		keep = 0.25
	}
	rng := RolloutRNG(t.Seed, t.Rollout, saltSkill)
	if rng.Float64() < p.Skill {
		return Planned(ref, t), nil
	}
	plan := make([]envprog.Action, 0, len(ref))
	for i, a := range ref {
		switch u := rng.Float64(); {
		case u < keep:
			plan = append(plan, a)
		case len(a.ToolCalls) == 0:
			plan = append(plan, envprog.Action{Content: randomWords(rng, 3+rng.IntN(8))})
		case u < keep+(1-keep)/2 && len(t.Tools) > 0:
			plan = append(plan, envprog.Action{ToolCalls: []envprog.ToolCall{RandomCall(rng, t.Tools, fmt.Sprintf("rnd-%d", i))}})
		}
	}
	return Planned(plan, t), nil
}

func (p SkillPolicy) String() string { return fmt.Sprintf("scripted-skill-%.2f", p.Skill) }
func (SkillPolicy) Simulated() bool  { return true }

// RandomCall is a call of a random tool of tools with random arguments of
// the right JSON types.
func RandomCall(rng *rand.Rand, tools []schemas.Tool, id string) envprog.ToolCall {
	tool := tools[rng.IntN(len(tools))]
	var sch jsonSchema
	_ = json.Unmarshal(tool.Function.Parameters, &sch)
	args := randomValue(rng, &sch, 0)
	if _, ok := args.(map[string]any); !ok {
		args = map[string]any{}
	}
	b, _ := json.Marshal(args)
	return envprog.ToolCall{ID: id, Name: tool.Function.Name, Arguments: b}
}

// jsonSchema is the part of a JSON Schema random arguments need.
type jsonSchema struct {
	Type       json.RawMessage        `json:"type"`
	Enum       []json.RawMessage      `json:"enum"`
	Properties map[string]*jsonSchema `json:"properties"`
	Required   []string               `json:"required"`
	Items      *jsonSchema            `json:"items"`
}

// types returns the schema's type names ("type" is a string or a list).
func (s *jsonSchema) types() []string {
	var one string
	if json.Unmarshal(s.Type, &one) == nil && one != "" {
		return []string{one}
	}
	var many []string
	_ = json.Unmarshal(s.Type, &many)
	return many
}

// TypeOf is the first type name of a JSON Schema ("" when it has none).
func TypeOf(schema json.RawMessage) string {
	var s jsonSchema
	if json.Unmarshal(schema, &s) != nil {
		return ""
	}
	if t := s.types(); len(t) > 0 {
		return t[0]
	}
	return ""
}

func randomValue(rng *rand.Rand, s *jsonSchema, depth int) any {
	if s == nil {
		return randomWords(rng, 1)
	}
	if len(s.Enum) > 0 {
		var v any
		_ = json.Unmarshal(s.Enum[rng.IntN(len(s.Enum))], &v)
		return v
	}
	typ := "string"
	if ts := s.types(); len(ts) > 0 {
		typ = ts[rng.IntN(len(ts))]
	} else if s.Properties != nil {
		typ = "object"
	}
	switch typ {
	case "integer":
		return rng.IntN(21) - 2
	case "number":
		return float64(rng.IntN(20000)) / 100
	case "boolean":
		return rng.IntN(2) == 0
	case "null":
		return nil
	case "array":
		if depth > 4 {
			return []any{}
		}
		out := make([]any, rng.IntN(3))
		for i := range out {
			out[i] = randomValue(rng, s.Items, depth+1)
		}
		return out
	case "object":
		out := map[string]any{}
		if depth > 4 {
			return out
		}
		names := make([]string, 0, len(s.Properties))
		for k := range s.Properties {
			names = append(names, k)
		}
		slices.Sort(names) // map order must not make a plan nondeterministic
		for _, k := range names {
			if slices.Contains(s.Required, k) || rng.IntN(2) == 0 {
				out[k] = randomValue(rng, s.Properties[k], depth+1)
			}
		}
		return out
	default:
		if rng.IntN(2) == 0 {
			return randomID(rng)
		}
		return randomWords(rng, 1+rng.IntN(3))
	}
}

var words = []string{"alpha", "blue", "order", "north", "river", "seven", "ticket", "maple", "quick", "stone", "delta", "gift", "card", "flight", "yes", "no"}

func randomWords(rng *rand.Rand, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = words[rng.IntN(len(words))]
	}
	return strings.Join(w, " ")
}

const idChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func randomID(rng *rand.Rand) string {
	b := make([]byte, 6+rng.IntN(4))
	for i := range b {
		b[i] = idChars[rng.IntN(len(idChars))]
	}
	return string(b)
}
