// Package stream is trace's at-least-once Kafka runtime, shared by every
// stage that consumes a topic (ingest's rollout stage, the analyzer's
// rollout and label consumers; the synthesize and adapt stages consume
// NATS JetStream, through internal/bus).
//
// A Consumer reads one topic in a consumer group, decodes each message with a
// Decoder, hands the valid records to a Sink (or streams them into a
// StreamSink) in batches, writes the invalid ones to a dead-letter topic
// (dlq.go), and commits offsets. Files by concern: sink.go (the Sink,
// StreamSink and Stream contracts), consumer.go (the pipeline: fetch, decode,
// write, drain), dlq.go (dead letters and their headers), retry.go (capped,
// jittered backoff), lag.go (consumer-group lag), metrics.go (Prometheus
// instruments), config.go (Config, its defaults and validation, Fatal).
//
// Contracts, in short (each is spelled out on the type it concerns):
//
//   - Offsets are committed only when the batch's valid records are durable
//     (Sink.Write or Stream.Commit returned nil) and its dead letters were
//     acknowledged by all in-sync replicas: at-least-once, so sinks must be
//     idempotent.
//   - Cancelling Run's ctx stops fetching; the batch in flight still gets
//     Config.DrainTimeout to be written, dead-lettered and committed, then
//     Run returns nil. Batches not yet taken by the write stage are not
//     committed (they are redelivered). A sink may give its batch up
//     sooner, uncommitted, once Stopping(ctx) is closed (ErrStopped).
//   - Sink errors are retried forever with backoff (backpressure) unless
//     Config.IsRetryable says no (by default: errors wrapped with Fatal),
//     which stops Run with the error. Kafka errors are always retried.
//   - A Consumer's Run is not called concurrently; Sink and Stream methods
//     are called from one goroutine at a time; a Decoder is called
//     concurrently from Config.DecodeWorkers goroutines. A *Metrics is safe
//     for concurrent use by any number of consumers.
package stream
