package dashboard

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/synthesizer"
)

// linksIn are the links of the first element of body that opens with open
// (up to its first </div>).
func linksIn(t *testing.T, body, open string) []*url.URL {
	t.Helper()
	i := strings.Index(body, open)
	if i < 0 {
		t.Fatalf("no %s in the page", open)
	}
	div := body[i:]
	div = div[:strings.Index(div, "</div>")]
	var out []*url.URL
	for _, m := range regexp.MustCompile(`href="([^"]*)"`).FindAllStringSubmatch(div, -1) {
		u, err := url.Parse(html.UnescapeString(m[1]))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

// TestSelectorLinksKeepTheOtherParameters: a page's links that change one
// parameter (a status filter, a range of days, an environment, a number of
// weeks) keep the others the page was asked with (limit, the filters,
// top, at), and its filter form keeps limit: clicking one reset them.
func TestSelectorLinksKeepTheOtherParameters(t *testing.T) {
	st := openStore(t)
	h := New(Deps{Store: st, Environments: synthesizer.SinkStore{Rows: st}, Dicts: registry(), Eval: testEval,
		Now: func() time.Time { return time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC) }})
	for _, tt := range []struct {
		path, div string
		links     int
		keep      url.Values
		form      string // a hidden input the filter form must have ("" none)
	}{
		{"/environments?limit=7&env=sim-airline&agent_version=1.4.0&status=DONE&token=tk", `<div class="ranges below">`, 1 + len(synthesizer.Statuses),
			url.Values{"limit": {"7"}, "env": {"sim-airline"}, "agent_version": {"1.4.0"}, "token": {"tk"}}, `<input type="hidden" name="limit" value="7">`},
		{"/triggers?limit=9&env=sim-airline&capability=precondition_verification&days=7", `<div class="ranges below">`, 5,
			url.Values{"limit": {"9"}, "env": {"sim-airline"}, "capability": {"precondition_verification"}}, `<input type="hidden" name="limit" value="9">`},
		{"/capability?env=airline&agent_version=v2&dict=1&name=" + capMulti + "&examples=2&hours=72", `<div class="ranges">`, 8,
			url.Values{"examples": {"2"}, "env": {"airline"}, "name": {capMulti}}, ""},
		{"/trends?top=3&weeks=4&at=2026-11-30T00:00:00Z", `<div class="ranges">`, 4,
			url.Values{"top": {"3"}, "at": {"2026-11-30T00:00:00Z"}}, ""},
	} {
		code, body := getStatus(h, tt.path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", tt.path, code, body)
		}
		links := linksIn(t, body, tt.div)
		if len(links) != tt.links {
			t.Errorf("%s: %d links, want %d", tt.path, len(links), tt.links)
		}
		for _, u := range links {
			for k, v := range tt.keep {
				if got := u.Query().Get(k); got != v[0] {
					t.Errorf("%s: link %s has %s=%q, want %q", tt.path, u, k, got, v[0])
				}
			}
		}
		if tt.form != "" && !strings.Contains(body, tt.form) {
			t.Errorf("%s: the filter form lacks %s", tt.path, tt.form)
		}
	}
}
