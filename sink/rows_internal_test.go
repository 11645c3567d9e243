package sink

import (
	"math/rand/v2"
	"strings"
	"testing"

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
