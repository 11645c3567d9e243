package llmtest

import (
	"encoding/json"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"strings"
	"unicode"
)

// EmbeddingDims is the size of the default embeddings.
const EmbeddingDims = 64

// BagOfWords is the default embedding of POST /v1/embeddings: lower-cased
// words hashed into EmbeddingDims buckets, L2-normalised, so texts sharing
// words are similar (cosine) and the answer is deterministic.
func BagOfWords(text string) []float64 {
	v := make([]float64, EmbeddingDims)
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		h := fnv.New32a()
		h.Write([]byte(w))
		v[h.Sum32()%EmbeddingDims]++
	}
	n := 0.0
	for _, x := range v {
		n += x * x
	}
	if n > 0 {
		n = math.Sqrt(n)
		for i := range v {
			v[i] /= n
		}
	}
	return v
}

// EmbeddingRequests is the number of POST /v1/embeddings requests served.
func (s *Server) EmbeddingRequests() int64 { return s.embeds.Load() }

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	s.embeds.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody("reading body: "+err.Error(), "invalid_request_error"))
		return
	}
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody("body is not JSON: "+err.Error(), "invalid_request_error"))
		return
	}
	var inputs []string
	if err := json.Unmarshal(req.Input, &inputs); err != nil {
		var one string
		if json.Unmarshal(req.Input, &one) != nil {
			writeJSON(w, http.StatusBadRequest, errorBody("input must be a string or an array of strings", "invalid_request_error"))
			return
		}
		inputs = []string{one}
	}
	data := make([]any, len(inputs))
	for i, in := range inputs {
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": BagOfWords(in)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "model": req.Model, "data": data,
		"usage": map[string]any{"prompt_tokens": len(inputs), "total_tokens": len(inputs)}})
}
