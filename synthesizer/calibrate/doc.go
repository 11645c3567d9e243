// Package calibrate measures whether an environment program is worth
// training on (TRACE-METHOD.md step 2, the release's
// calibrate_environment.py): a rollout runner plays an envprog.Env with a
// Policy for seeds × rollouts, hints on a share of each group; Summarize
// turns the per-seed groups of rewards into the calibration summary (mean,
// success rate, std, constant / all-success / all-zero / informative group
// shares, pass@k, histogram) and a verdict against Bands with a diagnosis
// for the repair loop (too easy, too hard, or which band failed).
//
// Policies: OpenAIPolicy is a model behind the OpenAI-compatible chat API
// with tool calling (OpenAI, vLLM, Ollama, llama.cpp). The others are not
// models and their summaries say so (Summary.Simulated): OraclePolicy,
// RandomPolicy and SkillPolicy are scripted policies of known skill for
// tests; internal/dev/simpolicy's SimulatedPolicy plays like an agent
// version of the simulated fleet (internal/dev/simulate), planted deficits
// included, for `trace demo`.
//
// Summarize and the bands are pure; Run does no I/O of its own beyond the
// Env and the Policy it is given.
package calibrate
