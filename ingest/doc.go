// Package ingest brings rollouts into trace: the rollout stage's decoder
// and ClickHouse sink (rollouts.go, run on the stream package's consumer),
// converters from third-party result formats (τ²-bench, tau2.go), and
// `trace replay` of rollout files onto Kafka (replay.go).
package ingest
