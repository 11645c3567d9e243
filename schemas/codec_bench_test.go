package schemas_test

import (
	"testing"
	"time"

	"github.com/traceops/trace/internal/dev/bench"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// BenchmarkParsers: the hand-written parser (scanRollout, in use) beside
// the one on jsontext, alone and with the ingest stage's compaction into a
// row, on whole and compact τ² rollouts. cpu-µs/op is this process's CPU
// time per rollout, which other processes on a shared machine inflate less
// than ns/op. This is the measurement behind docs/ARCHITECTURE.md's "The
// rollout codec":
//
//	go test -run '^$' -bench Parsers ./schemas/
func BenchmarkParsers(b *testing.B) {
	rs, err := bench.LoadTau2(shareddata.Dir(b, "tau2"))
	if err != nil {
		b.Fatal(err)
	}
	for _, set := range []bench.Set{bench.Whole, bench.Compact} {
		d, err := bench.NewDataset(set, rs, "benchprs")
		if err != nil {
			b.Fatal(err)
		}
		var docs [][]byte
		size := 0
		for i := range d.Templates() {
			docs = append(docs, d.Value(i, nil))
			size += len(docs[i])
		}
		for _, p := range []struct {
			name  string
			parse func([]byte) (*schemas.RawRollout, string)
		}{{"scan", schemas.ParseScan}, {"jsontext", schemas.ParseJSONText}} {
			for _, row := range []bool{false, true} {
				name := string(set) + "/" + p.name
				if row {
					name += "+row"
				}
				b.Run(name, func(b *testing.B) {
					b.SetBytes(int64(size / len(docs)))
					b.ReportAllocs()
					cpu0 := bench.CPUTime()
					for i := 0; b.Loop(); i++ {
						r, why := p.parse(docs[i%len(docs)])
						if r == nil {
							b.Fatal(why)
						}
						if row {
							sink.RawRolloutRow(r, sink.Coord{})
						}
					}
					b.ReportMetric(float64((bench.CPUTime()-cpu0)/time.Nanosecond)/1e3/float64(b.N), "cpu-µs/op")
				})
			}
		}
	}
}
