package sink

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

var quoteSeeds = []string{
	"", "plain ascii text", `{"reservation_id": "ABC123", "status": "ok", "n": [1, 2]}`,
	"tabs\tand\nnewlines\r\n", "<b>&amp;</b>", "naïve café — ☃ 😀", "bad \xff\xfe utf8 \xc3",
	"line\u2028sep\u2029", "\x00\x01\x1f\x7f", strings.Repeat(`\"`, 20), strings.Repeat("é", 301),
	strings.Repeat("abcdefg", 50) + "\"", "12345678\"12345678\\12345678<",
}

func checkQuote(t *testing.T, s string) {
	t.Helper()
	want, _ := json.Marshal(s)
	if got := appendString(nil, s); string(got) != string(want) {
		t.Fatalf("appendString(%q) = %s, want %s", s, got, want)
	}
	for _, n := range []int{1, 2, 8, 9, 16, 300} {
		wantCut, wantOK := truncCutSlow(s, n)
		gotCut, gotOK := truncCut(s, n)
		if gotOK != wantOK || (gotOK && gotCut != wantCut) {
			t.Fatalf("truncCut(%q, %d) = %d, %v; want %d, %v", s, n, gotCut, gotOK, wantCut, wantOK)
		}
	}
}

// appendString is byte for byte encoding/json, and truncCut the plain rule,
// on tricky and on random strings (quote-dense, multibyte, invalid UTF-8).
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range quoteSeeds {
		checkQuote(t, s)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", " ", `"`, `\`, "<", ">", "&", "\n", "\t", "\x01", "é", "☃", "😀", "\u2028", "\xff", "\xe2\x80", "12345678"}
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		checkQuote(t, b.String())
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range quoteSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkQuote(t, s)
		if utf8.ValidString(s) {
			var back string
			if err := json.Unmarshal(appendString(nil, s), &back); err != nil || back != s {
				t.Fatalf("round trip of %q: %q, %v", s, back, err)
			}
		}
	})
}
