// Package envtest holds environments written in Go against envprog.Env,
// for tests that must not depend on the Starlark runtime.
package envtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
)

// Ledger is a small environment written in Go against envprog.Env, for
// tests that must not depend on the Starlark runtime: each
// seed asks for 2–3 priority changes of to-dos; the reward is 0.8 × the
// share of required changes made + 0.2 × whether the final answer names
// every changed to-do.
type Ledger struct {
	NoHint bool         // no hint(): Info().HasHint is false
	Resets atomic.Int64 // episodes started
}

var ledgerTools = []schemas.Tool{
	{Type: "function", Function: schemas.FunctionDef{Name: "get_todo", Parameters: json.RawMessage(
		`{"type":"object","properties":{"todo_id":{"type":"string"}},"required":["todo_id"]}`)}},
	{Type: "function", Function: schemas.FunctionDef{Name: "set_todo_priority", Parameters: json.RawMessage(
		`{"type":"object","properties":{"todo_id":{"type":"string"},"priority":{"type":"string","enum":["low","high"]}},"required":["todo_id","priority"]}`)}},
}

func (e *Ledger) Info() envprog.Info {
	return envprog.Info{Name: "ledger", Tools: ledgerTools, HasHint: !e.NoHint, HasReference: true}
}

func (e *Ledger) Close() error { return nil }

func (e *Ledger) Reset(_ context.Context, seed int64) (envprog.Episode, error) {
	e.Resets.Add(1)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	ep := &ledgerEpisode{seed: seed, want: map[string]string{}, done: map[string]string{}}
	n := 2 + rng.IntN(2)
	var asks []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("T%04d", rng.IntN(10000))
		pr := []string{"low", "high"}[rng.IntN(2)]
		ep.want[id] = pr
		ep.order = append(ep.order, id)
		asks = append(asks, fmt.Sprintf("%s to %s", id, pr))
	}
	ep.start = envprog.Start{System: "You manage a to-do ledger.", User: "Set the priority of " + strings.Join(asks, ", ") + "."}
	ep.msgs = []envprog.Message{{Role: "system", Content: ep.start.System}, {Role: "user", Content: ep.start.User}}
	return ep, nil
}

type ledgerEpisode struct {
	seed     int64
	start    envprog.Start
	want     map[string]string
	order    []string
	done     map[string]string
	final    string
	finished bool
	turns    int
	msgs     []envprog.Message
}

func (p *ledgerEpisode) Seed() int64          { return p.seed }
func (p *ledgerEpisode) Start() envprog.Start { return p.start }
func (p *ledgerEpisode) Close() error         { return nil }
func (p *ledgerEpisode) Messages() []envprog.Message {
	return append([]envprog.Message(nil), p.msgs...)
}

func (p *ledgerEpisode) Step(_ context.Context, a envprog.Action) (envprog.StepResult, error) {
	if p.finished {
		return envprog.StepResult{}, envprog.ErrDone
	}
	p.turns++
	p.msgs = append(p.msgs, envprog.Message{Role: "assistant", Content: a.Content, ToolCalls: a.ToolCalls})
	if len(a.ToolCalls) == 0 {
		p.final, p.finished = a.Content, true
		return envprog.StepResult{Done: true}, nil
	}
	var res envprog.StepResult
	for _, c := range a.ToolCalls {
		var args struct {
			TodoID   string `json:"todo_id"`
			Priority string `json:"priority"`
		}
		out := "Error: invalid arguments"
		if json.Unmarshal(c.Arguments, &args) == nil {
			switch c.Name {
			case "get_todo":
				out = fmt.Sprintf(`{"todo_id": %q}`, args.TodoID)
			case "set_todo_priority":
				p.done[args.TodoID] = args.Priority
				out = "ok"
			default:
				out = "Error: unknown tool " + c.Name
			}
		}
		m := envprog.Message{Role: "tool", Content: out, ToolCallID: c.ID, Name: c.Name}
		res.ToolResults = append(res.ToolResults, m)
		p.msgs = append(p.msgs, m)
	}
	if p.turns >= 24 {
		p.finished, res.Done = true, true
	}
	return res, nil
}

func (p *ledgerEpisode) Reward(context.Context) (envprog.Reward, error) {
	ok := 0
	named := true
	for _, id := range p.order {
		if p.done[id] == p.want[id] {
			ok++
		}
		named = named && strings.Contains(p.final, id)
	}
	action := float64(ok) / float64(len(p.order))
	comm := 0.0
	if named {
		comm = 1
	}
	return envprog.Reward{Value: 0.8*action + 0.2*comm, Components: map[string]float64{"action": action, "communication": comm}}, nil
}

func (p *ledgerEpisode) Hint(context.Context) (string, error) {
	return "Make every change the user lists, then name each to-do in your answer.", nil
}

func (p *ledgerEpisode) Reference(context.Context) ([]envprog.Action, error) {
	var out []envprog.Action
	for i, id := range p.order {
		args, _ := json.Marshal(map[string]string{"todo_id": id, "priority": p.want[id]})
		out = append(out,
			envprog.Action{ToolCalls: []envprog.ToolCall{{ID: fmt.Sprintf("r%d", 2*i), Name: "get_todo", Arguments: json.RawMessage(fmt.Sprintf(`{"todo_id":%q}`, id))}}},
			envprog.Action{ToolCalls: []envprog.ToolCall{{ID: fmt.Sprintf("r%d", 2*i+1), Name: "set_todo_priority", Arguments: args}}})
	}
	return append(out, envprog.Action{Content: "Done: " + strings.Join(p.order, ", ") + "."}), nil
}
