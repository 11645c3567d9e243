package sink

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// prefixEnd keeps exactly the characters a cut needs: the text it keeps
// unescapes to the first n characters of the whole (or all of it), for
// escapes, surrogate pairs in either case and multi-byte characters at
// every position.
func TestPrefixEnd(t *testing.T) {
	pieces := []string{"a", " ", "é", "€", "😀", `\n`, `\"`, `\\`, `\/`, `\u00e9`, `\u0041`, `\ud83d\ude00`, `\uD83D\uDE00`, `\uDBFF\uDFFF`, `\u2028`}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		body := b.String()
		whole, err := jsontext.AppendUnquote(nil, `"`+body+`"`)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		runes := []rune(string(whole))
		for _, n := range []int{0, 1, 2, 5, 17, 39, 100} {
			end := prefixEnd([]byte(body), n)
			got, err := jsontext.AppendUnquote(nil, `"`+body[:end]+`"`)
			if err != nil {
				t.Fatalf("prefix %q of %q (n=%d) is not a whole number of escapes: %v", body[:end], body, n, err)
			}
			want := string(runes[:min(n, len(runes))])
			if string(got) != want {
				t.Fatalf("prefixEnd(%q, %d): %q, want %q", body, n, got, want)
			}
		}
	}
}

// A server from 20.1 on refuses an INSERT block spanning more than
// max_partitions_per_insert_block (100) partitions with TOO_MANY_PARTS (252),
// which IsRetryable retries: rollouts or labels whose times span more than
// 100 months (tables are partitioned by month) made the ingest batch fail
// the same way forever. The store's connections lift the limit on those
// servers, and send no such setting to 18.16, which does not know it.
func TestSessionSettings(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		want map[string]any
	}{
		{Version{18, 16, 1}, nil},
		{Version{19, 17, 4}, nil},
		{Version{20, 1, 2}, map[string]any{"max_partitions_per_insert_block": 0}},
		{Version{26, 7, 3}, map[string]any{"max_partitions_per_insert_block": 0}},
	} {
		got := sessionSettings(FeaturesFor(tc.v))
		if len(got) != len(tc.want) {
			t.Errorf("%v: settings %v, want %v", tc.v, got, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%v: settings %v, want %v", tc.v, got, tc.want)
			}
		}
	}
}

// TestEventTime: a rollout without an end time takes its own start time,
// else its Kafka message's timestamp (kept when the message is
// redelivered), not the insert time.
func TestEventTime(t *testing.T) {
	end := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	start := time.Date(2025, 6, 1, 9, 0, 0, 0, time.UTC)
	msg := time.Date(2026, 12, 1, 11, 30, 0, 0, time.FixedZone("CET", 3600))
	for _, c := range []struct {
		name            string
		end, start, msg time.Time
		want            time.Time
	}{
		{"its own end time wins", end, start, msg, end},
		{"its own start time, not the message's (a replay of history)", time.Time{}, start, msg, start},
		{"the message's timestamp, in UTC", time.Time{}, time.Time{}, msg, msg.UTC()},
		{"none: zero (the insert time then)", time.Time{}, time.Time{}, time.Time{}, time.Time{}},
		{"a timestamp the column cannot hold is not used", time.Time{}, time.Time{}, time.Unix(-5, 0), time.Time{}},
	} {
		got := EventTime(c.end, c.start, c.msg)
		if !got.Equal(c.want) || got.Location() != c.want.Location() {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
