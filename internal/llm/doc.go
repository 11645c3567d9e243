// Package llm is trace's client for OpenAI-compatible chat-completions
// servers: OpenAI itself, vLLM, Ollama's /v1 API and llama.cpp servers
// (llama-server and llama-cpp-python's server) work unchanged, because the
// client speaks only the common subset — POST {BaseURL}/chat/completions with
// model, messages, temperature, max_tokens, optional logprobs and an optional
// response_format; usage and choices[0].message.content in the answer. A
// server that refuses max_tokens for max_completion_tokens (OpenAI's
// reasoning models) is sent max_completion_tokens from then on.
//
// What the client guarantees to its callers (the labeler, discovery, routing):
//
//   - An accepted answer satisfied every check the caller asked for: it is one
//     JSON value once a wrapping ``` fence is removed, the request's JSON
//     Schema accepts it, no object repeats a key, and the caller's Validate
//     returned nil. Nothing else is "repaired".
//   - Failures that another try may fix are retried with a fresh, identical
//     request and capped exponential backoff: 429 (after Retry-After), 5xx,
//     408 and 409 (as OpenAI's SDKs retry them), time-outs, connection
//     errors and rejected answers. Other 4xx answers are returned at once. The error then lists every attempt's outcome.
//   - Every HTTP attempt yields exactly one audit row (AuditRecord) through
//     the Recorder: model, endpoint without credentials, sha256 of the
//     messages, tokens from usage, latency, attempt number, outcome.
//   - The API key is sent as a Bearer token and never appears in an audit row,
//     a log line or an error; Config prints it as [REDACTED].
//   - All calls of one Client share one concurrency bound and one rate limit.
//
// Structured output: StructuredJSONSchema (OpenAI, vLLM, Ollama, llama-server)
// sends the schema for constrained decoding; llama-cpp-python's server wants
// StructuredJSONObjectSchema ({"type":"json_object","schema":…}), which it
// compiles into a grammar — the difference between a tiny model that answers
// valid JSON most of the time and one that rarely does.
package llm
