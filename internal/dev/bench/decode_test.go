package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/schemas"
)

var (
	loadOnce sync.Once
	loaded   map[Set][][]byte
	loadErr  error
)

func sets(tb testing.TB) map[Set][][]byte {
	dir := shareddata.Dir(tb, "tau2")
	loadOnce.Do(func() {
		rs, err := LoadTau2(dir)
		if err != nil {
			loadErr = err
			return
		}
		loaded = map[Set][][]byte{}
		for _, set := range []Set{Whole, Compact} {
			d, err := NewDataset(set, rs, "testtest")
			if err != nil {
				loadErr = err
				return
			}
			for i := range d.Templates() {
				loaded[set] = append(loaded[set], d.Value(i, nil))
			}
		}
	})
	if loadErr != nil {
		tb.Fatal(loadErr)
	}
	return loaded
}

// legacyDecodeRollout is the schema path alone: encoding/json into `any`,
// JSON Schema validation, the finite reward, then encoding/json again into
// the struct (what DecodeRollout would cost without its parser).
func legacyDecodeRollout(data []byte) (*schemas.Rollout, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data")
	}
	if err := schemas.Validate(schemas.KindRollout, doc); err != nil {
		return nil, err
	}
	reward := doc.(map[string]any)["outcome"].(map[string]any)["reward"].(json.Number)
	if f, err := strconv.ParseFloat(string(reward), 64); err != nil || math.IsInf(f, 0) {
		return nil, errors.New("non-finite")
	}
	var r schemas.Rollout
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// runCPU runs fn b.N times over the set and reports, besides ns/op (wall
// time, which other processes on a shared 2-core machine inflate), the CPU
// time this process used per op (cpu-µs/op) and MB/s.
func runCPU(b *testing.B, docs [][]byte, fn func([]byte) error) {
	var n int
	for _, d := range docs {
		n += len(d)
	}
	b.SetBytes(int64(n / len(docs)))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := CPUTime()
	for i := 0; i < b.N; i++ {
		if err := fn(docs[i%len(docs)]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((CPUTime()-cpu0)/time.Nanosecond)/1e3/float64(b.N), "cpu-µs/op")
}

// BenchmarkDecodeRollout: schemas.DecodeRollout and DecodeRawRollout (the
// jsontext parser) against the schema path alone and encoding/json's struct
// decoding alone (no validation), on whole and compact τ² rollouts.
func BenchmarkDecodeRollout(b *testing.B) {
	all := sets(b)
	for _, set := range []Set{Whole, Compact} {
		docs := all[set]
		b.Run(string(set)+"/DecodeRollout", func(b *testing.B) {
			runCPU(b, docs, func(d []byte) error { _, err := schemas.DecodeRollout(d, schemas.DecodeOptions{}); return err })
		})
		b.Run(string(set)+"/DecodeRawRollout", func(b *testing.B) {
			runCPU(b, docs, func(d []byte) error { _, err := schemas.DecodeRawRollout(d, schemas.DecodeOptions{}); return err })
		})
		b.Run(string(set)+"/legacy-schema-path", func(b *testing.B) {
			runCPU(b, docs, func(d []byte) error { _, err := legacyDecodeRollout(d); return err })
		})
		b.Run(string(set)+"/encoding-json-struct-only", func(b *testing.B) {
			runCPU(b, docs, func(d []byte) error { var r schemas.Rollout; return json.Unmarshal(d, &r) })
		})
	}
}

// BenchmarkDecodeAndRow: decode plus the row conversion (ingest.DecodeRolloutRow), the consumer's CPU
// per rollout apart from Kafka and the ClickHouse driver.
func BenchmarkDecodeAndRow(b *testing.B) {
	all := sets(b)
	for _, set := range []Set{Whole, Compact} {
		b.Run(string(set), func(b *testing.B) {
			dec := ingest.DecodeRolloutRow(0) // as the ingest stage decodes
			runCPU(b, all[set], func(d []byte) error {
				_, err := dec(d)
				return err
			})
		})
	}
}

func TestDatasetClones(t *testing.T) {
	rs, err := LoadTau2(shareddata.Dir(t, "tau2"))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := NewDataset(Compact, rs, "abcd1234")
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1, 163, 164, 999999999} {
		r, err := schemas.DecodeRollout(ds.Value(i, nil), schemas.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("abcd1234-c-%09d", i)
		if r.RolloutID != want || string(ds.Key(i)) != r.Key() {
			t.Fatalf("message %d: id %q key %q, want %q %q", i, r.RolloutID, ds.Key(i), want, r.Key())
		}
		var row map[string]any
		if err := json.Unmarshal(ds.Row(i, nil), &row); err != nil || row["rollout_id"] != want || row["messages"] == "" {
			t.Fatalf("row %d: %v %v", i, err, row["rollout_id"])
		}
	}
}

func TestDatasets(t *testing.T) {
	all := sets(t)
	for _, set := range []Set{Whole, Compact} {
		docs := all[set]
		var n int
		for _, d := range docs {
			n += len(d)
			r, err := schemas.DecodeRollout(d, schemas.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			lr, err := legacyDecodeRollout(d)
			if err != nil {
				t.Fatal(err)
			}
			rb, _ := json.Marshal(r)
			lb, _ := json.Marshal(lr)
			if !bytes.Equal(rb, lb) {
				t.Fatalf("%s: DecodeRollout and the schema path decode differently:\n%s\n%s", set, rb, lb)
			}
		}
		t.Logf("%s: %d templates, %d bytes on average", set, len(docs), n/len(docs))
	}
}
