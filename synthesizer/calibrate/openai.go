package calibrate

import (
	"context"
	"fmt"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/synthesizer/envprog"
)

// ToolChatter is what OpenAIPolicy needs of a model client; *llm.Client
// implements it (retries, rate limit and the llm_calls audit included).
type ToolChatter interface {
	ChatTools(ctx context.Context, req llm.ToolsRequest) (llm.ToolsResponse, error)
	Model() string
}

// OpenAIPolicy is a model behind an OpenAI-compatible chat-completions API
// with tool calling (OpenAI, vLLM, Ollama's /v1, llama.cpp servers): each
// turn sends the conversation so far, the environment's tools and the run's
// temperature, and plays the answer's tool calls, or its text as the final
// answer when it has none. It keeps no state between turns and is safe for
// concurrent use. A failed call (after the client's retries) fails the
// calibration with its error.
type OpenAIPolicy struct {
	Client ToolChatter
	// Label prefixes the audit rows' rollout id: "<Label>/<seed>/<rollout>".
	Label string
	// MaxTokens bounds one answer (0: the client's default).
	MaxTokens int
}

// NewOpenAIPolicy is the policy of client, its audit rows labeled label.
func NewOpenAIPolicy(client *llm.Client, label string) *OpenAIPolicy {
	return &OpenAIPolicy{Client: client, Label: label}
}

// Act asks the model for the next turn.
func (p *OpenAIPolicy) Act(ctx context.Context, t Turn) (envprog.Action, error) {
	msgs := make([]llm.ToolMessage, len(t.Messages))
	for i, m := range t.Messages {
		lm := llm.ToolMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			lm.ToolCalls = append(lm.ToolCalls, llm.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
		msgs[i] = lm
	}
	temp := t.Temperature
	resp, err := p.Client.ChatTools(ctx, llm.ToolsRequest{
		// The audit row's run number carries the turn of the rollout.
		Purpose: "calibrate", RolloutID: fmt.Sprintf("%s/%d/%d", p.Label, t.Seed, t.Rollout), Run: t.Index,
		Messages: msgs, Tools: t.Tools, Temperature: &temp, MaxTokens: p.MaxTokens,
	})
	if err != nil {
		return envprog.Action{}, err
	}
	a := envprog.Action{Content: resp.Content}
	for _, c := range resp.ToolCalls {
		a.ToolCalls = append(a.ToolCalls, envprog.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
	}
	return a, nil
}

func (p *OpenAIPolicy) String() string { return "openai " + p.Client.Model() }

// Simulated is false: this policy is a model.
func (p *OpenAIPolicy) Simulated() bool { return false }
