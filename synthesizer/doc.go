// Package synthesizer is TRACE step 2, targeted environment synthesis
// (TRACE-METHOD.md), as the synthesize role of `trace run`: every synthesis
// request the analyzer publishes on NATS JetStream subject
// trace.synthesis.<env>.<capability> (schema synthesis_request.v1, stream
// TRACE_SYNTHESIS) becomes a validated, calibrated training environment, a
// Starlark program (package envprog), announced on trace.environments.ready
// (schema environment_ready.v1) once DONE.
//
// Files by concern:
//
//   - state.go: the pure state machine PENDING → GENERATING → VALIDATING →
//     CALIBRATING → DONE | FAILED, and WAITING_FOR_LLM (no generation
//     model and no template fits, or no policy to calibrate with). At most
//     MaxAttempts (5) programs per path; the fifth failure is FAILED, never
//     DONE. Table-tested.
//   - stage.go: Stage.Synthesize drives the machine for one request:
//     an Author writes each attempt's program, a Validator checks it, a
//     Calibrator plays it; every transition is saved (Store), every
//     failure's diagnosis is fed to the next attempt, DONE is published.
//     The environment id is derived from the trigger id, so a redelivered
//     or duplicated request resumes or re-acknowledges the same record.
//   - generate.go, extract.go: the generation agent (prompts/
//     generate_environment.md through internal/llm) and the extraction of
//     the program from its answer; an answer without one is a failed attempt.
//   - adapters.go: the Validator (envprog's checks, model programs
//     sandboxed), the Calibrator (calibrate.Run with a policy), the template
//     Author (templates.Instantiate, knobs stepped as templates.Tune does)
//     and the FamilyMatcher.
//   - worker.go, queue.go: the JetStream worker (one capability at a time
//     per target environment, highest mean Δ first; in-progress acks; Nak
//     with a growing delay; FAILED after MaxDeliver). At start it requeues
//     the WAITING_FOR_LLM environments its stage can now take further on
//     the same consumer (Msg-Id = environment id and record version), so
//     that replicas started together resume each one once.
//   - sinkstore.go: the records in ClickHouse (sink's environments table),
//     example rollouts, the dictionary's definitions and families.
//   - settings.go: the configuration section and Build.
//
// Interfaces are defined here, where they are consumed; the app wires the
// adapters (internal/app/synthesize.go).
package synthesizer
