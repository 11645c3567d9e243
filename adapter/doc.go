// Package adapter is TRACE step 3 as a stage of `trace run` (the adapt
// role): for every ready environment it builds a training job
// (adapter/plan), dispatches it once per (environment, plan revision) to a
// trainer backend (adapter/dispatch), tracks the job through the events
// its trainer reports (status, event history, a deadline on silence), and
// registers the adapter of a succeeded job in the registry. The registry
// (Registry) moves adapters between candidate, active, retired and
// rolled_back, loading them into and unloading them from the serving
// engine (adapter/serving: vLLM's runtime LoRA API); auto-activation runs
// as its own work queue (RunActivations), and a reconciliation
// (Reconciler) reloads active adapters an engine forgot and unloads
// retired ones it still serves.
//
// Exactly once: a job id is derived from the environment id and the plan
// revision; the stage claims it in a NATS KV bucket (atomic across
// replicas, durable across restarts) before it dispatches, and checks the
// training_jobs table first. A redelivered ready event therefore never
// dispatches a second job. A crash between the claim and the dispatch
// leaves a DISPATCHED job that no trainer reports on: its deadline fails
// it, visibly.
//
// The pure parts (Apply, the event → status machine) are tested with
// tables; Stage is tested against NATS and ClickHouse.
package adapter
