package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// EmbeddingsRequest is one call of POST /embeddings (OpenAI).
type EmbeddingsRequest struct {
	// Purpose labels the audit rows.
	Purpose string
	// Model overrides Config.Model (an embedding model is usually another
	// model than the chat one).
	Model string
	Input []string
}

// Embed returns one vector per input, in input order, from the server's
// OpenAI-compatible /embeddings endpoint, with Chat's retries (429, 5xx,
// time-outs and connection errors), concurrency bound, rate limit and
// audit rows.
func (c *Client) Embed(ctx context.Context, req EmbeddingsRequest) ([][]float64, error) {
	if len(req.Input) == 0 {
		return nil, nil
	}
	model := req.Model
	if model == "" {
		model = c.cfg.Model
	}
	body, err := json.Marshal(map[string]any{"model": model, "input": req.Input, "encoding_format": "float"})
	if err != nil {
		return nil, err
	}
	audit := Request{Purpose: req.Purpose, Messages: []Message{{Role: "user", Content: fmt.Sprintf("%d inputs", len(req.Input))}}}
	hash := PromptHash([]Message{{Role: "embeddings", Content: string(body)}})
	out, _, err := retry(ctx, c, audit, func(attempt int) (attemptResult, [][]float64) {
		start := time.Now()
		res, vecs := c.embedAttempt(ctx, body, len(req.Input))
		c.record(ctx, audit, hash, attempt, start, res)
		return res, vecs
	})
	return out, err
}

func (c *Client) embedAttempt(ctx context.Context, body []byte, n int) (attemptResult, [][]float64) {
	release, failed := c.acquire(ctx)
	if failed != nil {
		return *failed, nil
	}
	defer release()
	actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, c.cfg.BaseURL+"/embeddings", bytes.NewReader(body))
	if err != nil {
		return attemptResult{outcome: OutcomeNetwork, err: c.redactErr(err)}, nil
	}
	hreq.Header.Set("Content-Type", "application/json")
	if c.cfg.APIKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.cfg.APIKey.Reveal())
	}
	hresp, err := c.http.Do(hreq)
	if err != nil {
		return c.transportFailure(ctx, actx, err, c.cfg.Timeout), nil
	}
	data, err := io.ReadAll(io.LimitReader(hresp.Body, maxResponseBytes+1))
	hresp.Body.Close()
	if err != nil {
		return c.transportFailure(ctx, actx, err, c.cfg.Timeout), nil
	}
	if s := hresp.StatusCode; s < 200 || s > 299 {
		return c.statusFailure(s, hresp.Header, data, nil), nil
	}
	res := attemptResult{status: hresp.StatusCode}
	var wr struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &wr); err != nil {
		res.outcome, res.retryable, res.err = OutcomeInvalidJSON, true, fmt.Errorf("%w: embeddings envelope: %v (body %q)", ErrInvalidJSON, err, cut(string(data), 120))
		return res, nil
	}
	if wr.Usage != nil {
		res.promptTokens = wr.Usage.PromptTokens
	}
	out := make([][]float64, n)
	for _, d := range wr.Data {
		if d.Index < 0 || d.Index >= n || len(d.Embedding) == 0 {
			res.outcome, res.retryable, res.err = OutcomeSchema, true, fmt.Errorf("%w: embedding index %d of %d inputs", ErrSchema, d.Index, n)
			return res, nil
		}
		out[d.Index] = d.Embedding
	}
	for i, v := range out {
		if v == nil {
			res.outcome, res.retryable, res.err = OutcomeSchema, true, fmt.Errorf("%w: no embedding for input %d", ErrSchema, i)
			return res, nil
		}
	}
	res.outcome = OutcomeOK
	return res, out
}
