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
//
// BenchmarkFrames/sandboxed runs the program in its sandbox worker, as
// `trace serve` does (the allocations reported are the server process's
// alone; the time includes the worker's round trips).
func BenchmarkFrames(b *testing.B) {
	b.Run("in-process", func(b *testing.B) { benchFrames(b, envprog.Load) })
	b.Run("sandboxed", func(b *testing.B) { benchFrames(b, envprog.LoadSandboxed) })
}

func benchFrames(b *testing.B, load func(context.Context, string, []byte, envprog.Limits) (envprog.Env, error)) {
	env, err := load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
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

// FuzzServerFrame: any frame on a session with the example's episode is
// answered (an observation, a state, an error or an mcp answer) without a
// panic, and the session still plays a valid step afterwards.
func FuzzServerFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"step","data":{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"get_user_details","arguments":"{\"user_id\":\"x\"}"}}]}}`,
		`{"type":"step","data":{"tool_calls":[{"function":{"name":"update_reservation_baggages","arguments":{"reservation_id":"A","total_baggages":-1,"nonfree_baggages":2,"payment_id":"p"}}}]}}`,
		`{"type":"step","data":{"type":"call_tool","tool_name":"cancel_reservation","arguments":{"reservation_id":"A"}}}`,
		`{"type":"mcp","data":{"jsonrpc":"2.0","method":"tools/call","params":{"name":"get_reservation_details","arguments":{"reservation_id":7}},"id":1}}`,
		`{"type":"reset","data":{"seed":3,"hint":true}}`, `{"type":"state"}`, `{"type":"step","data":{"content":"bye"}}`, `{`,
	} {
		f.Add([]byte(s))
	}
	env, err := envprog.Load(context.Background(), examples.PreconditionAirlineName, examples.PreconditionAirline, envprog.Limits{})
	if err != nil {
		f.Fatal(err)
	}
	cat := NewStaticCatalog()
	cat.Add("ex", env, Entry{})
	srv, err := New(DefaultConfig(), Options{Catalog: cat})
	if err != nil {
		f.Fatal(err)
	}
	defer srv.Close(context.Background())
	ctx := context.Background()
	e, err := srv.environment(ctx, "ex")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sess, perr := e.acquire("ws", nil)
		if perr != nil {
			t.Fatal(perr)
		}
		defer e.release(sess)
		srv.frame(ctx, e, sess, []byte(`{"type":"reset","data":{"seed":1}}`))
		out, stop := srv.frame(ctx, e, sess, b)
		if out == nil && !stop {
			t.Fatalf("no answer to %q", b)
		}
		if stop {
			return
		}
		out, _ = srv.frame(ctx, e, sess, []byte(`{"type":"reset","data":{"seed":2}}`))
		raw, ok := out.([]byte)
		if !ok || !json.Valid(raw) || !regexp.MustCompile(`^\{"type":"observation"`).Match(raw) {
			t.Fatalf("after %q the session does not reset: %v", b, out)
		}
	})
}
