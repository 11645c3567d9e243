package llmtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// RateLimited is a 429 with Retry-After (seconds or an HTTP date).
func RateLimited(retryAfter string) Reply {
	r := Reply{Status: http.StatusTooManyRequests, Body: mustJSON(errorBody("Rate limit reached", "rate_limit_exceeded"))}
	if retryAfter != "" {
		r.Header = map[string]string{"Retry-After": retryAfter}
	}
	return r
}

// RateLimitedMS is a 429 with OpenAI's retry-after-ms header.
func RateLimitedMS(ms int) Reply {
	r := RateLimited("")
	r.Header = map[string]string{"Retry-After-Ms": strconv.Itoa(ms)}
	return r
}

// ServerError is a 500.
func ServerError() Reply {
	return Reply{Status: http.StatusInternalServerError, Body: mustJSON(errorBody("The server had an error while processing your request", "server_error"))}
}

// Status is a bare error status with an OpenAI error body carrying msg.
func Status(code int, msg string) Reply {
	return Reply{Status: code, Body: mustJSON(errorBody(msg, "invalid_request_error"))}
}

// RefuseMaxTokens is OpenAI's answer to a request with max_tokens for one
// of its reasoning models (o1, o3, gpt-5, …), which take
// max_completion_tokens only: a 400 naming the parameter.
func RefuseMaxTokens() Reply {
	return Reply{Status: http.StatusBadRequest, Body: mustJSON(map[string]any{"error": map[string]any{
		"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
		"type":    "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}})}
}

// Slow delays r by d (use a d longer than the client's timeout to script a
// time-out).
func Slow(d time.Duration, r Reply) Reply {
	r.Delay = d
	return r
}

// Text is a 200 whose answer is content.
func Text(content string) Reply { return Reply{Content: content} }

// JSON is a 200 whose answer is v encoded as JSON.
func JSON(v any) Reply { return Reply{Content: mustJSON(v)} }

// Malformed is a 200 whose answer is broken JSON (a truncated object).
func Malformed() Reply { return Reply{Content: `{"labels": {"`, FinishReason: "length"} }

// Label is one (capability, label) pair of a scripted labeling answer.
type Label struct{ Capability, Label string }

// Labels is a 200 whose answer is a labeling answer in trace's format,
//
//	{"labels": {"<capability>": {"reason": "…", "label": "NA|PRESENT|LACKING"}, …}}
//
// with the given pairs in order. A pair may repeat a capability (the key is
// then written twice), name an unknown one, or use an invalid label: the
// faults a labeler must reject.
func Labels(pairs ...Label) Reply { return Reply{Content: LabelsJSON(pairs...)} }

// LabelsJSON renders pairs like Labels does.
func LabelsJSON(pairs ...Label) string {
	b := []byte(`{"labels": {`)
	for i, p := range pairs {
		if i > 0 {
			b = append(b, ", "...)
		}
		k, _ := json.Marshal(p.Capability)
		v, _ := json.Marshal(map[string]string{"reason": "scripted by llmtest", "label": p.Label})
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, v...)
	}
	return string(append(b, "}}"...))
}

// SchemaCapabilities returns the capability names of a labeling request: the
// properties of "labels" in the JSON Schema the request sent, in schema order.
func SchemaCapabilities(req Request) ([]string, error) {
	raw := req.Chat.Schema()
	if raw == nil {
		return nil, fmt.Errorf("request %d sent no schema", req.Seq)
	}
	var s struct {
		Properties struct {
			Labels struct {
				Required []string `json:"required"`
			} `json:"labels"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, err
	}
	if len(s.Properties.Labels.Required) == 0 {
		return nil, fmt.Errorf("request %d: schema has no required labels", req.Seq)
	}
	return s.Properties.Labels.Required, nil
}

// AutoLabels is a handler that answers every labeling request with a valid
// answer: label(req, capability) for each capability its schema requires.
func AutoLabels(label func(req Request, capability string) string) Handler {
	return func(req Request) Reply {
		caps, err := SchemaCapabilities(req)
		if err != nil {
			return Status(http.StatusBadRequest, "llmtest AutoLabels: "+err.Error())
		}
		pairs := make([]Label, len(caps))
		for i, c := range caps {
			pairs[i] = Label{c, label(req, c)}
		}
		return Labels(pairs...)
	}
}
