package envserver

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"

	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

// BenchmarkFrames measures the server's work for one benchmark episode
// (reset, two lookups, the final answer) without the network: frame
// decoding, validation, the program's calls and the encoding of the
// observations. go test -run '^$' -bench Frames ./synthesizer/envserver
func BenchmarkFrames(b *testing.B) {
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	cat := NewStaticCatalog()
	cat.Add("ex", env, Entry{})
	srv, err := New(DefaultConfig(), Options{Catalog: cat})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close(context.Background())
	ctx := context.Background()
	e, err := srv.environment(ctx, "ex")
	if err != nil {
		b.Fatal(err)
	}
	sess, _ := e.acquire("ws", nil)
	userRe := regexp.MustCompile(`user id ([a-z]+_[a-z]+_[0-9]+)`)
	resRe := regexp.MustCompile(`reservation ([A-Z0-9]{6})`)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		out, _ := srv.frame(ctx, e, sess, []byte(`{"type":"reset","data":{"seed":`+itoa(i)+`}}`))
		var f struct {
			Data struct {
				Observation struct {
					Messages []struct{ Content string } `json:"messages"`
				} `json:"observation"`
			} `json:"data"`
		}
		json.Unmarshal(out.([]byte), &f)
		user := f.Data.Observation.Messages[1].Content
		u, r := userRe.FindStringSubmatch(user), resRe.FindStringSubmatch(user)
		for _, a := range []string{
			`{"type":"step","data":{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"get_user_details","arguments":"{\"user_id\": \"` + u[1] + `\"}"}}]}}`,
			`{"type":"step","data":{"role":"assistant","tool_calls":[{"id":"2","type":"function","function":{"name":"get_reservation_details","arguments":"{\"reservation_id\": \"` + r[1] + `\"}"}}]}}`,
			`{"type":"step","data":{"role":"assistant","content":"I cannot do that."}}`,
		} {
			if out, _ := srv.frame(ctx, e, sess, []byte(a)); out == nil {
				b.Fatal("no answer")
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/3, "µs/step")
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
