// Package adapter is the home of TRACE steps 3 and 4: planning and
// dispatching one LoRA adapter training run per capability environment
// (GRPO on the synthesized environment, base model frozen), the adapter
// registry, and routing each task to its adapter with the base model as a
// zero-shot classifier over next-token logprobs.
//
// This stage is not implemented yet; it consumes trace.environments.ready,
// which the synthesizer will publish, and `trace run` will run it as a role.
package adapter
