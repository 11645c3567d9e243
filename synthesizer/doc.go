// Package synthesizer is the home of TRACE step 2, targeted environment
// synthesis (TRACE-METHOD.md): for each synthesis request the analyzer
// publishes on NATS JetStream subject trace.synthesis.<env>.<capability>
// (schema schemas/synthesis_request.v1.schema.json, stream TRACE_SYNTHESIS,
// one message per trigger epoch), a generation agent writes a verifiable
// training environment that isolates the capability, validates and
// calibrates it, and announces it on trace.environments.ready.
//
// This stage is not implemented yet; the analyzer already produces its input,
// and `trace run` will run it as one more role.
package synthesizer
