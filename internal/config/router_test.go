package config

import (
	"encoding/json"
	"github.com/traceops/trace/router"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/gcpace"
	"github.com/traceops/trace/synthesizer/envserver"
)

// TestRouterConfig: the route role is not a default role; with it, a
// missing upstream or base model and bad values fail naming the field;
// secrets are redacted.
func TestRouterConfig(t *testing.T) {
	d, err := Load("", nil)
	if err != nil || d.Has("route") || d.Router.TopP != 0.95 || d.Router.Context != "first_user" || !d.Router.FallbackOnMissingAdapter {
		t.Fatalf("defaults: %v %+v", err, d.Router)
	}
	_, err = Load("", []string{"roles=route"})
	for _, field := range []string{"router.upstream_url", "router.base_model"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("roles=route without %s: %v", field, err)
		}
	}
	_, err = Load("", []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m",
		"router.context=everything", "router.top_p=1.5", "router.label_constraint=grammar", "router.retrieval.embeddings_url=http://e:1/v1",
		"router.cache_max=0", "router.context_max_chars=10"})
	// router.cache_max 0 was taken as 100,000 (the router's default for an unset bound).
	for _, field := range []string{"router.context", "router.top_p", "router.label_constraint", "router.retrieval.embeddings_model", "router.cache_max", "router.context_max_chars"} {
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
	// router.passthrough: the defaults, a list of its own, none, and a bad pattern named.
	for _, tc := range []struct {
		set  string
		want []string
		err  string
	}{
		{"", router.DefaultPassthrough, ""},
		{"router.passthrough=POST /v1/embeddings,POST /v1/audio/transcriptions", []string{"POST /v1/embeddings", "POST /v1/audio/transcriptions"}, ""},
		{"router.passthrough=", nil, ""},
		{"router.passthrough=[]", nil, ""}, // YAML's empty list, as the README writes it
		{"router.passthrough=POST /v1/chat/completions", nil, "router.passthrough: "},
	} {
		sets := []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m"}
		if tc.set != "" {
			sets = append(sets, tc.set)
		}
		c, err := Load("", sets)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) || (err == nil && len(c.Router.Passthrough)+len(tc.want) > 0 && !slices.Equal(c.Router.Passthrough, tc.want)) {
			t.Errorf("%q: %q, %v; want %q %q", tc.set, c.Router.Passthrough, err, tc.want, tc.err)
		}
	}
	// router.max_body_bytes: the proxy's request body limit, 32 MiB by
	// default, raised for large (multimodal) bodies; below 64 KiB refused.
	for _, tc := range []struct {
		set  string
		want int64
		err  string
	}{
		{"", 32 << 20, ""},
		{"router.max_body_bytes=268435456", 256 << 20, ""},
		{"router.max_body_bytes=1000", 0, "router.max_body_bytes: must be at least 65536"},
	} {
		sets := []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m"}
		if tc.set != "" {
			sets = append(sets, tc.set)
		}
		c, err := Load("", sets)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) || (err == nil && c.Router.MaxBodyBytes != tc.want) {
			t.Errorf("%q: %d, %v; want %d %q", tc.set, c.Router.MaxBodyBytes, err, tc.want, tc.err)
		}
	}
	// router.fallback_on_missing_adapter is a boolean: off passes the upstream's 404 for an adapter through.
	if c, err := Load("", []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m",
		"router.fallback_on_missing_adapter=false"}); err != nil || c.Router.FallbackOnMissingAdapter {
		t.Errorf("router.fallback_on_missing_adapter=false: %v %v", err, c.Router.FallbackOnMissingAdapter)
	}
	_, err = Load("", []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m",
		"router.fallback_on_missing_adapter=maybe"})
	if err == nil || !strings.Contains(err.Error(), "fallback_on_missing_adapter") {
		t.Errorf("router.fallback_on_missing_adapter=maybe accepted: %v", err)
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

// A single role's collector pacing applies to a process that runs that
// role alone, never over GOGC from the environment, and never beside other
// roles.
func TestGCPolicy(t *testing.T) {
	const mib = 1 << 20
	route := func(pct int, headroom uint64) gcpace.Policy { return gcpace.Policy{Percent: pct, Headroom: headroom} }
	const routeSetting = "router.gogc, router.gc_headroom_mb"
	for _, tc := range []struct {
		roles    []string
		route    int
		headroom int
		env      int
		goenv    string
		want     gcpace.Policy
		setting  string
	}{
		{[]string{"route"}, 100, 128, 300, "", route(100, 128*mib), routeSetting},
		{[]string{"route", "route"}, 400, 0, 300, "", route(400, 0), routeSetting},
		{[]string{"route"}, 0, 64, 300, "", route(0, 64*mib), routeSetting},
		{[]string{"route"}, 0, 0, 300, "", gcpace.Policy{}, routeSetting},
		{[]string{"route"}, 100, 128, 300, "100", gcpace.Policy{}, ""},
		{[]string{"route"}, 100, 128, 300, "off", gcpace.Policy{}, ""},
		{[]string{"serve"}, 100, 128, 300, "", gcpace.Policy{Percent: 300}, "env.gogc"},
		{[]string{"serve"}, 100, 128, 0, "", gcpace.Policy{}, "env.gogc"},
		{[]string{"serve"}, 100, 128, 300, "200", gcpace.Policy{}, ""},
		{[]string{"route", "serve"}, 100, 128, 300, "", gcpace.Policy{}, ""},
		{[]string{"serve", "ingest"}, 100, 128, 300, "", gcpace.Policy{}, ""},
		{[]string{"ingest"}, 100, 128, 300, "", gcpace.Policy{}, ""},
		{[]string{"synthesize"}, 100, 128, 300, "", gcpace.Policy{}, ""},
		{nil, 100, 128, 300, "", gcpace.Policy{}, ""},
	} {
		c := Config{Roles: tc.roles, Router: Router{GOGC: tc.route, GCHeadroomMB: tc.headroom}, Env: envserver.Config{GOGC: tc.env}}
		if got, setting := c.GCPolicy(tc.goenv); got != tc.want || setting != tc.setting {
			t.Errorf("roles %v, router.gogc %d, router.gc_headroom_mb %d, env.gogc %d, GOGC=%q: %+v from %q, want %+v from %q",
				tc.roles, tc.route, tc.headroom, tc.env, tc.goenv, got, setting, tc.want, tc.setting)
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
	if d := DefaultRouter(); d.GOGC != 100 || d.GCHeadroomMB != 128 {
		t.Errorf("router.gogc, router.gc_headroom_mb default to %d, %d; want 100, 128", d.GOGC, d.GCHeadroomMB)
	}
	for _, kv := range []string{"router.gogc=-1", "router.gogc=10001", "router.gc_headroom_mb=-1", "router.gc_headroom_mb=1048577"} {
		_, err := Load("", []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m", kv})
		if key, _, _ := strings.Cut(kv, "="); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s accepted: %v", kv, err)
		}
	}
}

// TestRouterClassifierExtraBody: router.classifier_extra_body is an object
// from a YAML mapping or from JSON text (environment, --set), unset by
// default; a value that is no object, a field the router sets itself, or a
// field set alone from --set or the environment (a string then) fails at
// start naming the key.
func TestRouterClassifierExtraBody(t *testing.T) {
	route := []string{"roles=route", "router.upstream_url=http://127.0.0.1:8000/v1", "router.base_model=m"}
	c, err := Load("", route)
	if b, berr := c.Router.ClassifierBody(); err != nil || berr != nil || b != nil {
		t.Fatalf("default: %v %v %v", b, err, berr)
	}
	yml := filepath.Join(t.TempDir(), "trace.yaml")
	if err := os.WriteFile(yml, []byte("router:\n  classifier_extra_body:\n    chat_template_kwargs: {enable_thinking: false}\n    top_k: 20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		load func() (Config, error)
	}{
		{"yaml", func() (Config, error) { return Load(yml, route) }},
		{"--set", func() (Config, error) {
			return Load("", append(route, `router.classifier_extra_body={"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}`))
		}},
		{"environment", func() (Config, error) {
			t.Setenv("TRACE_ROUTER__CLASSIFIER_EXTRA_BODY", `{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}`)
			defer os.Unsetenv("TRACE_ROUTER__CLASSIFIER_EXTRA_BODY") // restored (unset) at the end of the test too
			return Load("", route)
		}},
	} {
		c, err := tc.load()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, err := c.Router.ClassifierBody()
		got, _ := json.Marshal(b)
		if err != nil || string(got) != `{"chat_template_kwargs":{"enable_thinking":false},"top_k":20}` {
			t.Fatalf("%s: %s %v", tc.name, got, err)
		}
	}
	for _, tc := range []struct{ set, want string }{
		{`router.classifier_extra_body=[1, 2]`, "router.classifier_extra_body: must be an object"},
		{`router.classifier_extra_body=enable_thinking: false`, "router.classifier_extra_body: must be an object"},
		{`router.classifier_extra_body={"max_tokens": 4096}`, "router.classifier_extra_body.max_tokens: the router sets max_tokens itself"},
		{`router.classifier_extra_body={"top_k": 1, "logprobs": false}`, "router.classifier_extra_body.logprobs: "},
		{`router.classifier_extra_body={"model": "other"}`, "router.classifier_extra_body.model: "},
		{`router.classifier_extra_body.chat_template_kwargs.enable_thinking=false`, "router.classifier_extra_body: set it whole, as JSON text (from --set router.classifier_extra_body.chat_template_kwargs.enable_thinking)"},
	} {
		if _, err := Load("", append(route, tc.set)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.set, err, tc.want)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("router:\n  classifier_extra_body: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad, route); err == nil || !strings.Contains(err.Error(), "router.classifier_extra_body: must be an object (a YAML mapping") {
		t.Errorf("a number in YAML: %v", err)
	}
}
