// Package router is TRACE's step 4, select & adapt: it routes each
// conversation to the LoRA adapter of the capability it needs, or to the
// base model, and serves an OpenAI-compatible proxy that forwards the
// conversation to the chosen model.
//
// The base model is the classifier. An environment's active adapters get
// labels A, B, C, … (each with its capability and description) and one more
// label means "no adapter" (labels.go). The model is asked for one token
// with its top_logprobs (prompts/route.md); the label probabilities are the
// sampled token merged with its alternatives, whitespace (or a tokenizer's
// mark for it, "Ġ", "▁") stripped, unknown tokens dropped, renormalised
// over the labels with a classifier temperature (probs.go). The decision rule (decide.go): "no adapter" on
// top means the base model; otherwise the top adapter is served, and with
// top_p the smallest set of adapters reaching p is recorded with
// renormalised weights. A decision is made once per conversation and cached
// (cache.go) while its adapter stays in the environment's active list. A
// model without logprobs, or none of the labels among them, routes to the
// base model with the reason recorded, never an error.
//
// The pure parts (labels, probabilities, rule, context, cache) have no I/O;
// Router (router.go) adds the classifier call and the registry of active
// adapters; Proxy (proxy.go) is the HTTP side, which forwards the caller's body with
// only the value of "model" spliced in (rewrite.go); Recorder (record.go)
// batches decisions into ClickHouse route_decisions off the request path.
package router
