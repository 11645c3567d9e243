package schemas

// The two rollout parsers, for the external benchmark (codec_bench_test.go).
var (
	ParseScan     = scanRollout
	ParseJSONText = parseJSONText
)
