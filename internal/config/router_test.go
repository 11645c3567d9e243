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
