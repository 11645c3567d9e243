package config

import (
	"strings"
	"testing"

	"github.com/traceops/trace/synthesizer/envserver"
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
	// The router appends /chat/completions (/embeddings) to these URLs: a query or a
	// fragment is refused, naming the field, without the user information.
	for _, field := range []string{"upstream_url", "classifier_url", "retrieval.embeddings_url"} {
		for _, u := range []string{"https://user:pw@example.openai.azure.com/openai/v1?api-version=2024-10-21", "http://127.0.0.1:8000/v1#x", "http://127.0.0.1:8000/v1?"} {
			_, err := Load("", []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m", "router." + field + "=" + u})
			if err == nil || !strings.Contains(err.Error(), "router."+field+": ") || !strings.Contains(err.Error(), "query or fragment") || strings.Contains(err.Error(), "pw") {
				t.Errorf("router.%s=%s: %v", field, u, err)
			}
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

// A single role's collector target applies to a process that runs that
// role alone, never over GOGC from the environment, and never beside other
// roles.
func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		roles   []string
		route   int
		env     int
		goenv   string
		want    int
		setting string
	}{
		{[]string{"route"}, 400, 300, "", 400, "router.gogc"},
		{[]string{"route", "route"}, 400, 300, "", 400, "router.gogc"},
		{[]string{"route"}, 0, 300, "", 0, "router.gogc"},
		{[]string{"route"}, 400, 300, "100", 0, ""},
		{[]string{"route"}, 400, 300, "off", 0, ""},
		{[]string{"serve"}, 400, 300, "", 300, "env.gogc"},
		{[]string{"serve"}, 400, 0, "", 0, "env.gogc"},
		{[]string{"serve"}, 400, 300, "200", 0, ""},
		{[]string{"route", "serve"}, 400, 300, "", 0, ""},
		{[]string{"serve", "ingest"}, 400, 300, "", 0, ""},
		{[]string{"ingest"}, 400, 300, "", 0, ""},
		{[]string{"synthesize"}, 400, 300, "", 0, ""},
		{nil, 400, 300, "", 0, ""},
	} {
		c := Config{Roles: tc.roles, Router: Router{GOGC: tc.route}, Env: envserver.Config{GOGC: tc.env}}
		if got, setting := c.GCPercent(tc.goenv); got != tc.want || setting != tc.setting {
			t.Errorf("roles %v, router.gogc %d, env.gogc %d, GOGC=%q: %d from %q, want %d from %q", tc.roles, tc.route, tc.env, tc.goenv, got, setting, tc.want, tc.setting)
		}
	}
	if d := envserver.DefaultConfig().GOGC; d != 400 {
		t.Errorf("env.gogc defaults to %d, want 400", d)
	}
	for _, v := range []string{"-1", "10001"} {
		_, err := Load("", []string{"roles=serve", "env.gogc=" + v})
		if err == nil || !strings.Contains(err.Error(), "env.gogc") {
			t.Errorf("env.gogc=%s accepted: %v", v, err)
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
