package config

import (
	"strings"
	"testing"
)

// TestRouterConfig: the route role is not a default role; with it, a
// missing upstream or base model and bad values fail naming the field;
// secrets are redacted.
func TestRouterConfig(t *testing.T) {
	d, err := Load("", nil)
	if err != nil || d.Has("route") || d.Router.TopP != 0.95 || d.Router.Context != "first_user" {
		t.Fatalf("defaults: %v %+v", err, d.Router)
	}
	_, err = Load("", []string{"roles=route"})
	for _, field := range []string{"router.upstream_url", "router.base_model"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("roles=route without %s: %v", field, err)
		}
	}
	_, err = Load("", []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m",
		"router.context=everything", "router.top_p=1.5", "router.label_constraint=grammar", "router.retrieval.embeddings_url=http://e:1/v1"})
	for _, field := range []string{"router.context", "router.top_p", "router.label_constraint", "router.retrieval.embeddings_model"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("bad %s accepted: %v", field, err)
		}
	}
	c, err := Load("", []string{"roles=route,serve", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m",
		"router.bearer_token=tok", "router.upstream_api_key=key"})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Redacted().Router; r.BearerToken != "[REDACTED]" || r.UpstreamAPIKey != "[REDACTED]" || c.Router.BearerToken != "tok" {
		t.Fatalf("redaction: %+v", r)
	}
}

// The route role's collector target applies to a route-only process,
// never over GOGC from the environment, and never beside other roles.
func TestRouteGOGC(t *testing.T) {
	for _, tc := range []struct {
		roles []string
		gogc  int
		env   string
		want  int
	}{
		{[]string{"route"}, 400, "", 400},
		{[]string{"route", "route"}, 400, "", 400},
		{[]string{"route"}, 0, "", 0},
		{[]string{"route"}, 400, "100", 0},
		{[]string{"route"}, 400, "off", 0},
		{[]string{"route", "serve"}, 400, "", 0},
		{[]string{"ingest"}, 400, "", 0},
		{nil, 400, "", 0},
	} {
		c := Config{Roles: tc.roles, Router: Router{GOGC: tc.gogc}}
		if got := c.RouteGOGC(tc.env); got != tc.want {
			t.Errorf("roles %v, router.gogc %d, GOGC=%q: %d, want %d", tc.roles, tc.gogc, tc.env, got, tc.want)
		}
	}
	if d := DefaultRouter().GOGC; d != 400 {
		t.Errorf("router.gogc defaults to %d, want 400", d)
	}
	for _, v := range []string{"-1", "10001"} {
		_, err := Load("", []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m", "router.gogc=" + v})
		if err == nil || !strings.Contains(err.Error(), "router.gogc") {
			t.Errorf("router.gogc=%s accepted: %v", v, err)
		}
	}
}
