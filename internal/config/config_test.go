package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/envprog"
)

func TestLoadLayers(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "trace.yaml")
	os.WriteFile(f, []byte(`
kafka:
  brokers: [k1:9092, k2:9092]
  batch_rows: 5000
clickhouse:
  addr: [ch:9000]
  password: s3cret
analyzer:
  min_failures: 50
  rearm_after: 2h
`), 0o644)
	t.Setenv("TRACE_KAFKA__BATCH_ROWS", "7000")
	t.Setenv("TRACE_HTTP__BEARER_TOKEN", "tok")
	c, err := Load(f, []string{"analyzer.k=2", "analyzer.labeler=none", "roles=ingest,serve"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Kafka.Brokers) != 2 || c.Kafka.BatchRows != 7000 || c.ClickHouse.Addr[0] != "ch:9000" {
		t.Fatalf("layers: %+v", c.Kafka)
	}
	if c.Analyzer.MinFailures != 50 || c.Analyzer.RearmAfter != 2*time.Hour || c.Analyzer.K != 2 || c.Analyzer.N != 0 || c.Analyzer.Rho != 0.10 {
		t.Fatalf("analyzer: %+v", c.Analyzer)
	}
	if strings.Join(c.Roles, ",") != "ingest,serve" || c.HTTP.BearerToken != "tok" || c.Kafka.RolloutsTopic != "trace.rollouts" {
		t.Fatalf("roles/env/defaults: %+v %+v", c.Roles, c.HTTP)
	}
	r := c.Redacted()
	if r.ClickHouse.Password != "[REDACTED]" || r.HTTP.BearerToken != "[REDACTED]" || c.ClickHouse.Password != "s3cret" {
		t.Fatalf("redaction: %+v", r.ClickHouse)
	}
}

// TestRedactedMasksURLPasswords: `trace config print` shows no password
// a URL carries (user:pass@host), and the configuration itself keeps it.
func TestRedactedMasksURLPasswords(t *testing.T) {
	c := Default()
	pw := "https://u:pw@h/v1"
	c.NATS.URL = "nats://u:pw@a:4222,nats://b:4222"
	c.LLM.BaseURL, c.Adapter.Serving.BaseURL, c.Adapter.Webhook.URL, c.Adapter.Webhook.CallbackURL = pw, pw, pw, pw
	c.Adapter.Plan.EnvServerURL, c.Router.UpstreamURL, c.Router.ClassifierURL, c.Router.Retrieval.EmbeddingsURL = pw, pw, pw, pw
	c.Synthesizer.Policies = []synthesizer.PolicySettings{{BaseURL: pw}}
	m, err := c.Redacted().Map()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), ":pw@") || strings.Count(string(b), "u:xxxxx@") != 10 {
		t.Fatalf("redacted configuration: %s", b)
	}
	if c.LLM.BaseURL != pw || c.Synthesizer.Policies[0].BaseURL != pw {
		t.Fatal("Redacted changed the configuration it copied")
	}
	// The command backend's environment: names shown, values not.
	c.Adapter.Command.Env = []string{"HF_TOKEN=hf_secret", "CUDA_VISIBLE_DEVICES=0", "EMPTY="}
	r := c.Redacted()
	if !slices.Equal(r.Adapter.Command.Env, []string{"HF_TOKEN=[REDACTED]", "CUDA_VISIBLE_DEVICES=[REDACTED]", "EMPTY="}) || c.Adapter.Command.Env[0] != "HF_TOKEN=hf_secret" {
		t.Fatalf("command env %v (copied from %v)", r.Adapter.Command.Env, c.Adapter.Command.Env)
	}
	// A NATS address with a password but no scheme: refused without
	// showing the password.
	if _, err := Load("", []string{"nats.url=tok:s3cret@nats.internal:4222"}); err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "nats.url") {
		t.Fatalf("nats.url without a scheme: %v", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	tests := []struct {
		set  []string
		want string
	}{
		{[]string{"roles=ingest,cook"}, `roles: unknown role "cook"`},
		{[]string{"kafka.brokers=nohost"}, "kafka.brokers"},
		{[]string{"kafka.batch_rows=0"}, "kafka.batch_rows"},
		{[]string{"kafka.sasl.mechanism=kerberos"}, "kafka.sasl.mechanism"},
		{[]string{"clickhouse.addr=ch"}, "clickhouse.addr"},
		// The embedded ClickHouse (no clickhouse.addr) takes the same
		// settings: they fail here, not after the servers have started.
		{[]string{"clickhouse.compression=gzip"}, "clickhouse.compression"},
		{[]string{"clickhouse.query_timeout=-2s"}, "clickhouse.query_timeout"},
		{[]string{"clickhouse.retention_days=-1"}, "clickhouse.retention_days"},
		{[]string{"clickhouse.database=a-b"}, "clickhouse.database"},
		{[]string{"nats.url=localhost"}, "nats.url"},
		{[]string{"nats.url=http://nats:4222"}, `nats.url: "http://nats:4222" is not a URL`},
		{[]string{"nats.url=nats://a:4222,b:4222"}, `nats.url: "b:4222"`},
		{[]string{"nats.url=nats://user:secret@a:4222,http://user:secret@b:4222"}, `nats.url: "http://[REDACTED]@b:4222"`},
		{[]string{"embedded.nats_port=99999"}, "embedded.nats_port: 99999 is not a TCP port"},
		{[]string{"nats.stream_max_age=-1h"}, "nats.stream_max_age: must be 0 (keep every message) or positive, got -1h0m0s"},
		{[]string{"nats.stream_max_age=5m"}, "nats.stream_max_age: 5m0s is shorter than the de-duplication window nats.duplicates (10m0s)"},
		{[]string{"nats.stream_max_age=1h", "nats.duplicates=2h"}, "nats.stream_max_age: 1h0m0s is shorter"},
		// A negative window used to become the 10m default silently.
		{[]string{"nats.duplicates=-1m"}, "nats.duplicates: must be 0 (the default, 10m0s) or at least 100ms, got -1m0s"},
		{[]string{"nats.duplicates=50ms"}, "nats.duplicates: must be 0 (the default, 10m0s) or at least 100ms, got 50ms"},
		{[]string{"embedded.clickhouse_port=65536"}, "embedded.clickhouse_port"},
		{[]string{"embedded.clickhouse_http_port=-1"}, "embedded.clickhouse_http_port"},
		{[]string{"analyzer.rho=2"}, "analyzer.rho"},
		{[]string{"analyzer.delta=1.5"}, "analyzer.delta"},
		{[]string{"analyzer.k=-1"}, "analyzer.k"},
		{[]string{"analyzer.k=11"}, "analyzer.n"},
		{[]string{"analyzer.labeler=llm"}, "llm.base_url"},
		{[]string{"analyzer.sample_failed=1.5"}, "analyzer.sample_failed"},
		{[]string{"http.addr=8080"}, "http.addr"},
		{[]string{"http.ready_timeout=0s"}, "http.ready_timeout"},
		{[]string{"kafka.max_message_bytes=100"}, "kafka.max_message_bytes"},
		{[]string{"env.max_observation_bytes=1000"}, "env.max_observation_bytes: 1000, must be at least 65536"},
		// Two consumer groups of one topic would split its partitions: the
		// rollouts the analyzer's member read would never be stored.
		{[]string{"kafka.analyze_group=trace-ingest"}, "kafka.analyze_group"},
		{[]string{"kafka.dlq_topic=trace.rollouts"}, "kafka.dlq_topic"},
		{[]string{"kafka.labels_topic=trace.rollouts"}, "kafka.labels_topic"},
		{[]string{"kafka.dlq_topic=trace.labels"}, "kafka.dlq_topic"},
		// Kafka refuses these topic names (kfake, the embedded broker, takes
		// them): they failed only once trace met a real cluster.
		{[]string{"kafka.rollouts_topic=trace rollouts"}, `kafka.rollouts_topic: "trace rollouts" is not a Kafka topic name`},
		{[]string{"kafka.dlq_topic=trace/rollouts.dlq"}, `kafka.dlq_topic: "trace/rollouts.dlq" is not a Kafka topic name`},
		{[]string{"kafka.labels_topic=.."}, `kafka.labels_topic: ".." is not a Kafka topic name`},
		{[]string{"kafka.rollouts_topic=" + strings.Repeat("t", 250)}, "kafka.rollouts_topic: " + `"` + strings.Repeat("t", 250) + `" is not a Kafka topic name`},
		{[]string{"kafka.labels_topic=" + strings.Repeat("t", 246)}, "kafka.labels_topic: its dead letters' topic " + `"` + strings.Repeat("t", 246) + `.dlq" is not a Kafka topic name`},
		{[]string{"kafka.labels_topic=trace.étiquettes"}, "kafka.labels_topic"},
		{[]string{"nokey"}, "--set"},
		{[]string{"synthesizer.max_attempts=9"}, "synthesizer.max_attempts"},
		{[]string{"llm.structured_output=grammar"}, `llm.structured_output: "grammar"`},
		{[]string{"llm.timeout=-1s"}, "llm.timeout"},
		{[]string{"llm.concurrency=-2"}, "llm.concurrency"},
		{[]string{"llm.rate_per_second=-1"}, "llm.rate_per_second"},
		{[]string{"kafka.session_timeout=500ms"}, "kafka.session_timeout: must be at least 1s"},
		{[]string{"kafka.rebalance_timeout=0s"}, "kafka.rebalance_timeout: must be at least 1s"},
		{[]string{"llm.runs=-1"}, "llm.runs"},
		{[]string{"llm.max_transcript_chars=0"}, "llm.max_transcript_chars: must be at least 1000, got 0"},
		{[]string{"analyzer.concurrency=-1"}, "analyzer.concurrency"},
		{[]string{"synthesizer.policy=oracle"}, "synthesizer.policy"},
		{[]string{"synthesizer.calibration.seeds=0"}, "synthesizer.calibration.seeds"},
		{[]string{"synthesizer.calibration.bands.success_min=0.9"}, "synthesizer.calibration.bands.success_min"},
		{[]string{"programs.max_memory=-1"}, "programs.max_memory -1: want a positive byte count"},
		{[]string{"programs.call_timeout=-1s"}, "programs.call_timeout -1s"},
		{[]string{"programs.max_turns=-3"}, "programs.max_turns -3"},
		{[]string{"programs.reset_cache=-2"}, "programs.reset_cache -2"},
		{[]string{"programs.max_steps=-2"}, "programs.max_steps"},
		{[]string{"programs.max_memory=16777216"}, "programs.reset_cache 8388608: more than a quarter of programs.max_memory (16777216)"},
	}
	for _, tt := range tests {
		_, err := Load("", tt.set)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Load(%v) = %v, want an error naming %q", tt.set, err, tt.want)
		}
	}
	if _, err := Load("", nil); err != nil {
		t.Fatalf("defaults must be valid: %v", err)
	}
	for _, u := range []string{"nats://a:4222", "tls://user:pw@a:4222", "nats://a:4222, nats://b:4222", "wss://nats.example:443", "NATS://a"} {
		c, err := Load("", []string{"nats.url=" + u})
		if err != nil {
			t.Errorf("nats.url %q: %v", u, err)
		} else if c.NATSURL() != u {
			t.Errorf("nats.url %q read as %q", u, c.NATSURL())
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), nil); err == nil || !strings.Contains(err.Error(), "config file") {
		t.Fatalf("missing file: %v", err)
	}
	for set, want := range map[string]time.Duration{"": 0, "nats.stream_max_age=0": 0, "nats.stream_max_age=30d": 30 * 24 * time.Hour, "nats.stream_max_age=10m": 10 * time.Minute} {
		var sets []string
		if set != "" {
			sets = []string{set}
		}
		c, err := Load("", sets)
		if err != nil {
			t.Errorf("%q: %v", set, err)
		} else if c.NATS.StreamMaxAge != want {
			t.Errorf("%q: nats.stream_max_age %s, want %s", set, c.NATS.StreamMaxAge, want)
		}
	}
	for _, set := range []string{"nats.duplicates=0", "nats.duplicates=100ms", "nats.duplicates=2h"} {
		if _, err := Load("", []string{set}); err != nil {
			t.Errorf("%q: %v", set, err)
		}
	}
}

// TestKAndNFollowTheLabelSource: unset, analyzer.k and analyzer.n stay 0
// whatever the labeler, and every cohort's K of N follows the source of its
// labels (the rules labeler's 1 of 1, llm.runs and 8/10 of it, 8 of 10 for
// external labels); set, they apply to every cohort.
func TestKAndNFollowTheLabelSource(t *testing.T) {
	llm := []string{"analyzer.labeler=llm", "llm.base_url=http://h/v1", "llm.model=m"}
	all := []string{schemas.SourceRules, schemas.SourceLLM, schemas.SourceExternal}
	tests := []struct {
		set  []string
		k, n int                      // as loaded
		want map[string]analyzer.KOfN // per source
	}{
		{nil, 0, 0, map[string]analyzer.KOfN{schemas.SourceRules: {K: 1, N: 1}, schemas.SourceLLM: {K: 8, N: 10}, schemas.SourceExternal: {K: 8, N: 10}}},
		{[]string{"analyzer.labeler=none"}, 0, 0, map[string]analyzer.KOfN{schemas.SourceRules: {K: 1, N: 1}, schemas.SourceLLM: {K: 8, N: 10}, schemas.SourceExternal: {K: 8, N: 10}}},
		{llm, 0, 0, map[string]analyzer.KOfN{schemas.SourceRules: {K: 1, N: 1}, schemas.SourceLLM: {K: 8, N: 10}, schemas.SourceExternal: {K: 8, N: 10}}},
		{append(llm, "llm.runs=5"), 0, 0, map[string]analyzer.KOfN{schemas.SourceRules: {K: 1, N: 1}, schemas.SourceLLM: {K: 4, N: 5}, schemas.SourceExternal: {K: 8, N: 10}}},
		{[]string{"llm.runs=3"}, 0, 0, map[string]analyzer.KOfN{schemas.SourceRules: {K: 1, N: 1}, schemas.SourceLLM: {K: 3, N: 3}, schemas.SourceExternal: {K: 8, N: 10}}},
		{append(llm, "analyzer.k=3", "analyzer.n=4"), 3, 4, map[string]analyzer.KOfN{schemas.SourceRules: {K: 3, N: 4}, schemas.SourceLLM: {K: 3, N: 4}, schemas.SourceExternal: {K: 3, N: 4}}},
		{[]string{"analyzer.k=1", "analyzer.n=1"}, 1, 1, map[string]analyzer.KOfN{schemas.SourceRules: {K: 1, N: 1}, schemas.SourceLLM: {K: 1, N: 1}, schemas.SourceExternal: {K: 1, N: 1}}},
		{[]string{"analyzer.n=5"}, 0, 5, map[string]analyzer.KOfN{schemas.SourceRules: {K: 4, N: 5}, schemas.SourceLLM: {K: 4, N: 5}, schemas.SourceExternal: {K: 4, N: 5}}},
		{[]string{"analyzer.labeler=none", "analyzer.k=9"}, 9, 0, map[string]analyzer.KOfN{schemas.SourceRules: {K: 9, N: 1}, schemas.SourceLLM: {K: 9, N: 10}, schemas.SourceExternal: {K: 9, N: 10}}},
	}
	for _, tt := range tests {
		c, err := Load("", tt.set)
		if err != nil {
			t.Fatalf("%v: %v", tt.set, err)
		}
		if c.Analyzer.K != tt.k || c.Analyzer.N != tt.n {
			t.Errorf("%v: k=%d n=%d, want %d %d", tt.set, c.Analyzer.K, c.Analyzer.N, tt.k, tt.n)
		}
		for _, src := range all {
			if got := c.Analyzer.KOfN([]string{src}); got != tt.want[src] {
				t.Errorf("%v: a cohort of %s labels is decided by %+v, want %+v", tt.set, src, got, tt.want[src])
			}
		}
	}
	// analyzer.k alone must be reachable by the configured labeler's runs.
	for _, set := range [][]string{{"analyzer.k=2"}, append(llm, "llm.runs=5", "analyzer.k=6"), {"analyzer.labeler=none", "analyzer.k=11"}} {
		if _, err := Load("", set); err == nil || !strings.Contains(err.Error(), "analyzer.n") {
			t.Errorf("%v: %v, want an error naming analyzer.n", set, err)
		}
	}
}

// TestVerifyDeltaFollowsTheSelection: unset, verify.delta is the
// selection's δ (analyzer.delta), so "gap closed" means the capability
// would no longer be selected; set, it is its own.
func TestVerifyDeltaFollowsTheSelection(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want float64
	}{
		{nil, 0.20},
		{[]string{"analyzer.delta=0.1"}, 0.1},
		{[]string{"analyzer.delta=0.35"}, 0.35},
		{[]string{"analyzer.delta=0.1", "verify.delta=0.3"}, 0.3},
		{[]string{"verify.delta=0.15"}, 0.15},
	} {
		c, err := Load("", tc.set)
		if err != nil {
			t.Fatalf("%v: %v", tc.set, err)
		}
		if c.Verify.Delta != tc.want {
			t.Errorf("%v: verify.delta %v, want %v", tc.set, c.Verify.Delta, tc.want)
		}
	}
}

// TestVerifyDeltaErrorsNameTheSetting: an analyzer.delta out of range is
// one error, analyzer.delta's (not a second one naming verify.delta, which
// the user did not set); one the selection takes but the closed loop
// cannot (0 or below) says verify.delta took it from analyzer.delta; a
// verify.delta set out of range is named as such.
func TestVerifyDeltaErrorsNameTheSetting(t *testing.T) {
	for _, tc := range []struct {
		set       []string
		want, not string
	}{
		{[]string{"analyzer.delta=2"}, "analyzer.delta must be in [-1, 1], got 2", "verify.delta"},
		{[]string{"analyzer.delta=-0.1"}, "verify.delta: unset, so analyzer.delta's -0.1", "analyzer.delta must"},
		{[]string{"analyzer.delta=0.1", "verify.delta=2"}, "verify.delta: must be in (0, 1], got 2", "analyzer.delta"},
	} {
		_, err := Load("", tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
			t.Errorf("%v: %v, want an error with %q and without %q", tc.set, err, tc.want, tc.not)
		}
	}
}

func TestSynthesizerSection(t *testing.T) {
	f := filepath.Join(t.TempDir(), "trace.yaml")
	os.WriteFile(f, []byte(`
synthesizer:
  max_attempts: 3
  templates: false
  calibration:
    seeds: 20
    rollouts: 8
    temperature: 1.0
    bands: {mean_min: 0.1, mean_max: 0.7}
  policies:
    - {environment: tau2-airline, agent_version: "*", base_url: "http://vllm:8000/v1", model: qwen3-30b, api_key: k3y}
`), 0o644)
	c, err := Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Synthesizer
	cal := s.CalibrationConfig()
	if s.MaxAttempts != 3 || s.Templates || cal.Seeds != 20 || cal.Rollouts != 8 || cal.Temperature != 1 || cal.Bands.MeanMin != 0.1 ||
		cal.Bands.MeanMax != 0.7 || cal.Bands.SuccessMax != 0.6 || s.Policy != "model" || len(s.Policies) != 1 || s.AckWait != 2*time.Minute {
		t.Fatalf("synthesizer: %+v", s)
	}
	if r := c.Redacted(); r.Synthesizer.Policies[0].APIKey != "[REDACTED]" || c.Synthesizer.Policies[0].APIKey != "k3y" {
		t.Fatalf("redaction: %+v / %+v", r.Synthesizer.Policies, c.Synthesizer.Policies)
	}
	if d, _ := Load("", nil); !d.Has("synthesize") || !d.Synthesizer.Templates || d.Synthesizer.CalibrationConfig().Seeds != 100 {
		t.Fatalf("defaults: roles %v, %+v", d.Roles, d.Synthesizer)
	}
}

// TestProgramsSection: programs: sets every limit of the environment
// programs from a file, the environment and --set (a duration with its
// unit), and unset limits keep envprog's defaults, which the printed
// configuration shows.
func TestProgramsSection(t *testing.T) {
	d, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Programs != envprog.DefaultLimits {
		t.Fatalf("default programs: %+v, want %+v", d.Programs, envprog.DefaultLimits)
	}
	m, err := d.Map()
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := m["programs"].(map[string]any); p["max_turns"] != 24 || p["call_timeout"] != "2s" {
		t.Fatalf("printed programs: %#v", m["programs"])
	}
	f := filepath.Join(t.TempDir(), "trace.yaml")
	os.WriteFile(f, []byte(`
programs:
  max_steps: 500000
  max_memory: 134217728
`), 0o644)
	t.Setenv("TRACE_PROGRAMS__MAX_TURNS", "12")
	c, err := Load(f, []string{"programs.call_timeout=750ms", "programs.reset_cache=-1"})
	if err != nil {
		t.Fatal(err)
	}
	want := envprog.Limits{MaxSteps: 500_000, MaxMemory: 128 << 20, CallTimeout: 750 * time.Millisecond, MaxTurns: 12, ResetCache: -1}
	if c.Programs != want {
		t.Fatalf("programs: %+v, want %+v", c.Programs, want)
	}
	if _, err := Load("", []string{"programs.max_stepz=1"}); err == nil || !strings.Contains(err.Error(), "programs.max_stepz: unknown key") {
		t.Fatalf("misspelled key: %v", err)
	}
}

// TestEnvServerURL: training jobs play the environments where this trace's
// serve role serves them, unless adapter.plan.env_server_url says otherwise.
func TestEnvServerURL(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		want string
	}{
		{"the serve role's http.addr", nil, "http://127.0.0.1:8080"},
		{"a dedicated env.addr", []string{"env.addr=127.0.0.1:8091"}, "http://127.0.0.1:8091"},
		{"http.addr on every interface", []string{"http.addr=0.0.0.0:8080"}, "http://127.0.0.1:8080"},
		{"http.addr without a host", []string{"http.addr=:8080"}, "http://127.0.0.1:8080"},
		{"env.addr on every IPv6 interface", []string{"env.addr=[::]:8091"}, "http://[::1]:8091"},
		{"a named host", []string{"http.addr=trace-serve:8080"}, "http://trace-serve:8080"},
		{"configured", []string{"env.addr=127.0.0.1:8091", "adapter.plan.env_server_url=https://envs.example.internal"}, "https://envs.example.internal"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load("", tt.set)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.EnvServerURL(); got != tt.want {
				t.Errorf("EnvServerURL() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestUnknownKeysFail: a misspelled or misplaced key, in the file, the
// environment or --set, fails Load naming it (the decoder ignored it, and
// the setting silently kept its default); variables of TRACE_ that name no
// section are not settings and stay ignored.
func TestUnknownKeysFail(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  map[string]string
		set  []string
		want []string
		ok   func(Config) bool // of a configuration that loads
	}{
		{name: "file", yaml: "kafka:\n  brokerz: [k1:9092]\nhttpp:\n  addr: 127.0.0.1:1\n",
			want: []string{"kafka.brokerz: unknown key (kafka has: ", "httpp: unknown key (the top level has: "}},
		{name: "file, squashed analyzer section", yaml: "analyzer:\n  min_failure: 50\n", want: []string{"analyzer.min_failure: unknown key"}},
		{name: "file, list of sections", yaml: "synthesizer:\n  policies:\n    - {environment: e, agent_version: \"*\", base_url: http://h/v1, modle: m}\n",
			want: []string{"synthesizer.policies[0].modle: unknown key"}},
		{name: "file, map of sections", yaml: "adapter:\n  plan:\n    environments:\n      tau2-retail: {lora_rnak: 8}\n",
			want: []string{"adapter.plan.environments.tau2-retail.lora_rnak: unknown key"}},
		{name: "environment", env: map[string]string{"TRACE_CLICKHOUSE__PASSWROD": "pw"},
			want: []string{"clickhouse.passwrod: unknown key", "(from TRACE_CLICKHOUSE__PASSWROD)"}},
		{name: "set", set: []string{"router.upstream=http://h/v1"}, want: []string{"router.upstream: unknown key", "(from --set router.upstream)"}},
		{name: "set, a secret's value not shown", set: []string{"clickhouse.pasword=hunter2"}, want: []string{"clickhouse.pasword: unknown key", "(from --set clickhouse.pasword)"}},
		{name: "not settings", env: map[string]string{"TRACE_LLM_PORT": "8081", "TRACE_ENV_TOKEN": "t", "TRACE_CONFIG": "", "TRACE_TEST_X": "1"}},
		// Keys are lower case: the decoder takes a key only in its own
		// case, and one in another case silently kept the default.
		{name: "file, section in another case", yaml: "Kafka:\n  brokers: [a:1]\n",
			want: []string{"Kafka.brokers: unknown key; keys are lower case (kafka.brokers)"}},
		{name: "file, key in another case", yaml: "kafka:\n  Brokers: [a:1]\n",
			want: []string{"kafka.Brokers: unknown key; keys are lower case (kafka.brokers)"}},
		{name: "file, squashed key and empty section in another case", yaml: "analyzer:\n  Min_Failures: 50\nHTTP: {}\n",
			want: []string{"analyzer.Min_Failures: unknown key; keys are lower case (analyzer.min_failures)", "HTTP: unknown key; keys are lower case (http)"}},
		{name: "file, in another case under a map of sections", yaml: "adapter:\n  plan:\n    environments:\n      Tau2-Retail: {Lora_Rank: 8}\n",
			want: []string{"adapter.plan.environments.Tau2-Retail.Lora_Rank: unknown key; keys are lower case (adapter.plan.environments.Tau2-Retail.lora_rank)"}},
		{name: "file, in another case in a list of sections", yaml: "Synthesizer:\n  policies:\n    - {environment: e, agent_version: \"*\", base_url: http://h/v1, model: m}\n",
			want: []string{"Synthesizer.policies[0].model: unknown key; keys are lower case (synthesizer.policies[0].model)"}},
		{name: "set, in another case", set: []string{"Kafka.brokers=z:1"},
			want: []string{"Kafka.brokers: unknown key; keys are lower case (kafka.brokers) (from --set Kafka.brokers)"}},
		// Environment variables are upper case by custom: their names are
		// read in any case.
		{name: "environment, any case", env: map[string]string{"TRACE_KAFKA__BATCH_ROWS": "5", "TRACE_Http__Addr": "127.0.0.1:1"},
			ok: func(c Config) bool { return c.Kafka.BatchRows == 5 && c.HTTP.Addr == "127.0.0.1:1" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := ""
			if tt.yaml != "" {
				f = filepath.Join(t.TempDir(), "trace.yaml")
				if err := os.WriteFile(f, []byte(tt.yaml), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			c, err := Load(f, tt.set)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if tt.ok != nil && !tt.ok(c) {
					t.Fatalf("Load: not the settings given: %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load accepted an unknown key, want an error naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load: %v\nwant it to name %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Load: %v\nshows a value", err)
			}
		})
	}
}

// TestCommaSplitsOnlyLists: a value with commas is a list for a list
// setting, from the environment as from --set, and stays one string for
// any other (a NATS server list in nats.url, a password).
func TestCommaSplitsOnlyLists(t *testing.T) {
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	for _, f := range []string{d1, d2} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("TRACE_ADAPTER__PLAN__DEFAULTS__TARGET_MODULES", "q_proj,v_proj")
	t.Setenv("TRACE_DICTIONARIES", d1+","+d2)
	t.Setenv("TRACE_KAFKA__BROKERS", "k1:9092,k2:9092")
	t.Setenv("TRACE_CLICKHOUSE__PASSWORD", "p,w")
	c, err := Load("", []string{"nats.url=nats://a:4222,nats://b:4222", "http.bearer_token=t,o,k", "roles=ingest,serve",
		"adapter.command.argv=python,-m,trainer"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		got, want any
	}{
		{"adapter.plan.defaults.target_modules", c.Adapter.Plan.Defaults.TargetModules, []string{"q_proj", "v_proj"}},
		{"dictionaries", c.Dictionary, []string{d1, d2}},
		{"kafka.brokers", c.Kafka.Brokers, []string{"k1:9092", "k2:9092"}},
		{"clickhouse.password", c.ClickHouse.Password, "p,w"},
		{"nats.url", c.NATS.URL, "nats://a:4222,nats://b:4222"},
		{"http.bearer_token", c.HTTP.BearerToken, "t,o,k"},
		{"roles", c.Roles, []string{"ingest", "serve"}},
		{"adapter.command.argv", c.Adapter.Command.Argv, []string{"python", "-m", "trainer"}},
	} {
		if !reflect.DeepEqual(tt.got, tt.want) {
			t.Errorf("%s = %#v, want %#v", tt.name, tt.got, tt.want)
		}
	}
}

// TestEmptySectionKeepsDefaults: a section with no values (`kafka:` alone,
// or with only comments under it) is null in YAML; it keeps the section's
// defaults instead of replacing them with zero values.
func TestEmptySectionKeepsDefaults(t *testing.T) {
	want, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, yaml string
		set        func(*Config) // what the file changes
	}{
		{name: "empty file", yaml: ""},
		{name: "only comments", yaml: "# kafka:\n#   batch_rows: 5\n"},
		{name: "a section alone", yaml: "kafka:\n"},
		{name: "a section with a comment", yaml: "analyzer:\n  # window: 1h\n"},
		{name: "several", yaml: "kafka:\nclickhouse:\nanalyzer:\nadapter:\nrouter:\nsynthesizer:\n"},
		{name: "a nested section", yaml: "kafka:\n  tls:\n  batch_rows: 5\nadapter:\n  serving:\n  plan:\n    defaults:\n",
			set: func(c *Config) { c.Kafka.BatchRows = 5 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "trace.yaml")
			if err := os.WriteFile(f, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := Load(f, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			w := want
			if tt.set != nil {
				tt.set(&w)
			}
			if !reflect.DeepEqual(c, w) {
				t.Errorf("Load:\n%+v\nwant the defaults:\n%+v", c, w)
			}
		})
	}
}

// loadCase is one configuration of a table: a YAML file, environment
// variables, --set flags.
type loadCase struct {
	name string
	yaml string
	env  map[string]string
	set  []string
}

func (lc loadCase) load(t *testing.T) (Config, error) {
	t.Helper()
	f := ""
	if lc.yaml != "" {
		f = filepath.Join(t.TempDir(), "trace.yaml")
		if err := os.WriteFile(f, []byte(lc.yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range lc.env {
		t.Setenv(k, v)
	}
	return Load(f, lc.set)
}

// TestDurationsNeedAUnit: a duration without a unit (3600 in YAML would be
// 3.6µs) fails naming its key, in the file as from the environment or
// --set; 0 needs none.
func TestDurationsNeedAUnit(t *testing.T) {
	for _, tt := range []struct {
		loadCase
		want string
	}{
		{loadCase{name: "file, integer", yaml: "analyzer:\n  window: 3600\n"}, "analyzer.window: 3600 has no unit"},
		{loadCase{name: "file, fraction", yaml: "analyzer:\n  window: 1.5\n"}, "analyzer.window: 1.5 has no unit"},
		{loadCase{name: "file, negative", yaml: "llm:\n  timeout: -5\n"}, "llm.timeout: -5 has no unit"},
		{loadCase{name: "file, nested", yaml: "adapter:\n  serving:\n    timeout: 30\n"}, "adapter.serving.timeout: 30 has no unit"},
		{loadCase{name: "file, text", yaml: "kafka:\n  batch_timeout: \"2\"\n"}, "kafka.batch_timeout: 2 has no unit"},
		{loadCase{name: "file, bool", yaml: "http:\n  ready_timeout: true\n"}, "http.ready_timeout: true is not a duration"},
		{loadCase{name: "environment", env: map[string]string{"TRACE_ANALYZER__WINDOW": "3600"}},
			"analyzer.window: 3600 has no unit: write one, e.g. 3600s or 3600m (units: ns, us, ms, s, m, h, d; 0 needs none) (from TRACE_ANALYZER__WINDOW)"},
		{loadCase{name: "set", set: []string{"router.cache_ttl=60"}}, "router.cache_ttl: 60 has no unit"},
		{loadCase{name: "set, not a duration", set: []string{"router.cache_ttl=soon"}}, `router.cache_ttl: "soon" is not a duration (e.g. 30s, 5m, 1h30m) (from --set router.cache_ttl)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.load(t); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load: %v, want an error naming %q", err, tt.want)
			}
		})
	}
	for _, tt := range []struct {
		loadCase
		got  func(Config) time.Duration
		want time.Duration
	}{
		{loadCase{name: "file, 0", yaml: "router:\n  cache_ttl: 0\n"}, func(c Config) time.Duration { return c.Router.CacheTTL }, 0},
		{loadCase{name: "file, with a unit", yaml: "analyzer:\n  window: 90m\n"}, func(c Config) time.Duration { return c.Analyzer.Window }, 90 * time.Minute},
		{loadCase{name: "file, days", yaml: "analyzer:\n  window: 1.5d\n"}, func(c Config) time.Duration { return c.Analyzer.Window }, 36 * time.Hour},
		{loadCase{name: "environment, 0", env: map[string]string{"TRACE_ROUTER__CACHE_TTL": "0"}}, func(c Config) time.Duration { return c.Router.CacheTTL }, 0},
		{loadCase{name: "set, with a unit", set: []string{"kafka.batch_timeout=250ms"}}, func(c Config) time.Duration { return c.Kafka.BatchTimeout }, 250 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.load(t)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.got(c); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// TestStrictScalars: a YAML value of another type than its setting's fails
// naming the key instead of being converted with a loss (batch_rows: 10.5
// was 10, auto_activate: 1 was true); text, all the environment and --set
// give, is parsed as before.
func TestStrictScalars(t *testing.T) {
	for _, tt := range []struct {
		loadCase
		want string
	}{
		{loadCase{name: "fraction for an integer", yaml: "kafka:\n  batch_rows: 10.5\n"}, "kafka.batch_rows: 10.5 is not a whole number"},
		{loadCase{name: "number for a bool", yaml: "adapter:\n  auto_activate: 1\n"}, "adapter.auto_activate: 1 is not true or false"},
		{loadCase{name: "zero for a bool", yaml: "kafka:\n  tls:\n    enabled: 0\n"}, "kafka.tls.enabled: 0 is not true or false"},
		{loadCase{name: "bool for an integer", yaml: "kafka:\n  batch_rows: true\n"}, "kafka.batch_rows: true is not a number"},
		{loadCase{name: "bool for a number", yaml: "analyzer:\n  sample_failed: true\n"}, "analyzer.sample_failed: true is not a number"},
		{loadCase{name: "bool for text", yaml: "llm:\n  model: true\n"}, `llm.model: true is not text (quote it: "true")`},
		{loadCase{name: "negative for an unsigned integer", yaml: "verify:\n  seed: -1\n"}, "verify.seed: -1 is negative"},
		{loadCase{name: "map of sections", yaml: "adapter:\n  plan:\n    environments:\n      tau2-retail: {lora_rank: 8.5}\n"},
			"adapter.plan.environments[tau2-retail].lora_rank: 8.5 is not a whole number"},
		{loadCase{name: "environment, fraction", env: map[string]string{"TRACE_KAFKA__BATCH_ROWS": "10.5"}}, "kafka.batch_rows: "},
		{loadCase{name: "set, not a bool", set: []string{"adapter.auto_activate=yes"}}, "adapter.auto_activate: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.load(t); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load: %v, want an error naming %q", err, tt.want)
			}
		})
	}
	for _, tt := range []struct {
		loadCase
		got, want func(Config) any
	}{
		{loadCase{name: "whole fraction for an integer", yaml: "kafka:\n  batch_rows: 1e4\n"},
			func(c Config) any { return c.Kafka.BatchRows }, func(Config) any { return 10000 }},
		{loadCase{name: "integer for a number", yaml: "analyzer:\n  sample_failed: 0\n"},
			func(c Config) any { return c.Analyzer.SampleFailed }, func(Config) any { return 0.0 }},
		{loadCase{name: "number for text", yaml: "llm:\n  model: 7\n"}, func(c Config) any { return c.LLM.Model }, func(Config) any { return "7" }},
		{loadCase{name: "environment, text", env: map[string]string{"TRACE_KAFKA__BATCH_ROWS": "10", "TRACE_ADAPTER__AUTO_ACTIVATE": "true", "TRACE_VERIFY__SEED": "7"}},
			func(c Config) any { return []any{c.Kafka.BatchRows, c.Adapter.AutoActivate, c.Verify.Seed} }, func(Config) any { return []any{10, true, uint64(7)} }},
		{loadCase{name: "set, text", set: []string{"kafka.batch_rows=10", "adapter.auto_activate=true", "analyzer.rho=0.2"}},
			func(c Config) any { return []any{c.Kafka.BatchRows, c.Adapter.AutoActivate, c.Analyzer.Rho} }, func(Config) any { return []any{10, true, 0.2} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.load(t)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := tt.got(c), tt.want(c); !reflect.DeepEqual(got, want) {
				t.Errorf("got %#v, want %#v", got, want)
			}
		})
	}
}

// TestListValues: in an environment variable or --set, an empty value of a
// list setting is the empty list (kafka.brokers= goes back to the embedded
// broker) and empty items (a trailing comma) are left out.
func TestListValues(t *testing.T) {
	brokers := "kafka:\n  brokers: [k1:9092]\n"
	for _, tt := range []struct {
		loadCase
		got  func(Config) any
		want any
	}{
		{loadCase{name: "set, empty", yaml: brokers, set: []string{"kafka.brokers="}}, func(c Config) any { return c.KafkaBrokers() }, []string{"127.0.0.1:9092"}},
		{loadCase{name: "environment, empty", yaml: brokers, env: map[string]string{"TRACE_KAFKA__BROKERS": ""}}, func(c Config) any { return c.KafkaBrokers() }, []string{"127.0.0.1:9092"}},
		{loadCase{name: "set, one", set: []string{"kafka.brokers=a:1"}}, func(c Config) any { return c.Kafka.Brokers }, []string{"a:1"}},
		{loadCase{name: "set, trailing comma", set: []string{"kafka.brokers=a:1,"}}, func(c Config) any { return c.Kafka.Brokers }, []string{"a:1"}},
		{loadCase{name: "set, empty items", set: []string{"kafka.brokers=,a:1,,b:2, "}}, func(c Config) any { return c.Kafka.Brokers }, []string{"a:1", "b:2"}},
		{loadCase{name: "set, spaces after the commas", set: []string{"kafka.brokers=a:1, b:2 ,c:3"}}, func(c Config) any { return c.Kafka.Brokers }, []string{"a:1", "b:2", "c:3"}},
		{loadCase{name: "environment, trailing comma", env: map[string]string{"TRACE_ADAPTER__PLAN__DEFAULTS__TARGET_MODULES": "q_proj,"}},
			func(c Config) any { return c.Adapter.Plan.Defaults.TargetModules }, []string{"q_proj"}},
		{loadCase{name: "set, empty list of an environment", set: []string{"adapter.plan.environments.tau2-retail.target_modules="}},
			func(c Config) any { return c.Adapter.Plan.Environments["tau2-retail"].TargetModules }, []string{}},
		{loadCase{name: "not a list", set: []string{"clickhouse.password=p,", "http.bearer_token="}},
			func(c Config) any { return []string{c.ClickHouse.Password, c.HTTP.BearerToken} }, []string{"p,", ""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.load(t)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.got(c); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
		})
	}
	// An empty list of roles is still refused, as no roles.
	if _, err := Load("", []string{"roles=,"}); err == nil || !strings.Contains(err.Error(), "roles: at least one role is required") {
		t.Errorf("roles=,: %v", err)
	}
}

// TestQueryLimits: clickhouse.query_timeout and query_max_memory are the
// effective limits (0 or unset: the defaults, 10s and 1 GiB), and -1 turns
// either off: for the timeout without a unit, or -1 of any unit.
func TestQueryLimits(t *testing.T) {
	const def, defMem = 10 * time.Second, int64(1 << 30)
	for _, tt := range []struct {
		loadCase
		timeout time.Duration
		mem     int64
	}{
		{loadCase{name: "defaults"}, def, defMem},
		{loadCase{name: "zero takes the default", set: []string{"clickhouse.query_timeout=0", "clickhouse.query_max_memory=0"}}, def, defMem},
		{loadCase{name: "set", set: []string{"clickhouse.query_timeout=30s", "clickhouse.query_max_memory=2048"}}, 30 * time.Second, 2048},
		{loadCase{name: "set, -1", set: []string{"clickhouse.query_timeout=-1", "clickhouse.query_max_memory=-1"}}, -1, -1},
		{loadCase{name: "set, -1s", set: []string{"clickhouse.query_timeout=-1s"}}, -1, defMem},
		{loadCase{name: "set, -1ms", set: []string{"clickhouse.query_timeout=-1ms"}}, -1, defMem},
		{loadCase{name: "set, -1ns", set: []string{"clickhouse.query_timeout=-1ns"}}, -1, defMem},
		{loadCase{name: "environment, -1", env: map[string]string{"TRACE_CLICKHOUSE__QUERY_TIMEOUT": "-1", "TRACE_CLICKHOUSE__QUERY_MAX_MEMORY": "-1"}}, -1, -1},
		{loadCase{name: "file, -1", yaml: "clickhouse:\n  query_timeout: -1\n  query_max_memory: -1\n"}, -1, -1},
		{loadCase{name: "file, -1h", yaml: "clickhouse:\n  query_timeout: -1h\n"}, -1, defMem},
		{loadCase{name: "file, -1 over a limit", yaml: "clickhouse:\n  query_timeout: 5s\n", set: []string{"clickhouse.query_timeout=-1"}}, -1, defMem},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.load(t)
			if err != nil {
				t.Fatal(err)
			}
			if c.ClickHouse.QueryTimeout != tt.timeout || c.ClickHouse.QueryMaxMemory != tt.mem {
				t.Errorf("query_timeout %s, query_max_memory %d; want %s, %d", c.ClickHouse.QueryTimeout, c.ClickHouse.QueryMaxMemory, tt.timeout, tt.mem)
			}
		})
	}
	for _, tt := range []struct {
		loadCase
		want string
	}{
		{loadCase{name: "another negative", set: []string{"clickhouse.query_timeout=-2s"}}, "clickhouse.query_timeout: must be > 0, or -1 for none, got -2s"},
		{loadCase{name: "another number", set: []string{"clickhouse.query_timeout=-2"}}, "clickhouse.query_timeout: -2 has no unit"},
		{loadCase{name: "file, another number", yaml: "clickhouse:\n  query_timeout: 30\n"}, "clickhouse.query_timeout: 30 has no unit"},
		{loadCase{name: "memory, another negative", set: []string{"clickhouse.query_max_memory=-2"}}, "clickhouse.query_max_memory: must be > 0 bytes, or -1 for none, got -2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.load(t); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load: %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// TestNullSettingNamed: a plain setting with no value (null in YAML, as a
// template's empty variable leaves it) is an error naming it, at any depth,
// not its zero value (a cache_ttl of 0, no token, no brokers); a null
// section still keeps its defaults.
func TestNullSettingNamed(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       []string
	}{
		{name: "a duration", yaml: "router:\n  cache_ttl:\n", want: []string{"router.cache_ttl: no value"}},
		{name: "a float and a string", yaml: "analyzer:\n  delta: ~\nrouter:\n  bearer_token: null\n",
			want: []string{"analyzer.delta: no value", "router.bearer_token: no value"}},
		{name: "a list", yaml: "kafka:\n  brokers:\n", want: []string{"kafka.brokers: no value"}},
		{name: "nested", yaml: "adapter:\n  serving:\n    base_url:\n", want: []string{"adapter.serving.base_url: no value"}},
		{name: "in a list of sections", yaml: "synthesizer:\n  policies:\n    - environment: e\n      model:\n",
			want: []string{"synthesizer.policies[0].model: no value"}},
		// What config print writes for unset optional settings loads.
		{name: "optional, a map, any type", yaml: "adapter:\n  plan:\n    defaults:\n      hint_ratio: null\nrouter:\n  classifier_extra_body: null\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "trace.yaml")
			if err := os.WriteFile(f, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(f, nil)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Load: %v, want it accepted", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Load accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestLLMBaseURLMeansItsV1: llm.base_url without a path is its /v1, where
// OpenAI, vLLM, Ollama and llama.cpp serve chat completions (every call
// was a 404 otherwise), and config print shows it so.
func TestLLMBaseURLMeansItsV1(t *testing.T) {
	for set, want := range map[string]string{
		"http://vllm:8000": "http://vllm:8000/v1", "http://vllm:8000/": "http://vllm:8000/v1",
		"http://vllm:8000/v1/chat/completions": "http://vllm:8000/v1", "https://gw.example/openai/v1/": "https://gw.example/openai/v1",
	} {
		c, err := Load("", []string{"llm.base_url=" + set})
		if err != nil {
			t.Fatal(err)
		}
		if c.LLM.BaseURL != want {
			t.Errorf("llm.base_url=%s: %q, want %q", set, c.LLM.BaseURL, want)
		}
	}
}

// TestLLMExtraBody: llm.extra_body is an object from a YAML mapping or
// from JSON text (environment, --set), unset by default, and reaches every
// request of the llm.* client; a value that is no object, a field the
// client sets itself (or a stream), or a field set alone from --set fails
// at start naming the key.
func TestLLMExtraBody(t *testing.T) {
	c, err := Load("", nil)
	if b, berr := c.LLM.Body(); err != nil || berr != nil || b != nil {
		t.Fatalf("default: %v %v %v", b, err, berr)
	}
	yml := filepath.Join(t.TempDir(), "trace.yaml")
	if err := os.WriteFile(yml, []byte("llm:\n  extra_body:\n    chat_template_kwargs: {enable_thinking: false}\n    top_k: 20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		load func() (Config, error)
	}{
		{"yaml", func() (Config, error) { return Load(yml, nil) }},
		{"--set", func() (Config, error) {
			return Load("", []string{`llm.extra_body={"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}`})
		}},
		{"environment", func() (Config, error) {
			t.Setenv("TRACE_LLM__EXTRA_BODY", `{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}`)
			defer os.Unsetenv("TRACE_LLM__EXTRA_BODY")
			return Load("", nil)
		}},
	} {
		c, err := tc.load()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, err := c.LLM.Body()
		got, _ := json.Marshal(b)
		if err != nil || string(got) != `{"chat_template_kwargs":{"enable_thinking":false},"top_k":20}` {
			t.Fatalf("%s: %s %v", tc.name, got, err)
		}
	}
	for _, tc := range []struct{ set, want string }{
		{`llm.extra_body=[1, 2]`, "llm.extra_body: must be an object"},
		{`llm.extra_body={"stream": true}`, "llm.extra_body.stream: "},
		{`llm.extra_body={"top_k": 1, "max_tokens": 4096}`, "llm.extra_body.max_tokens: "},
		{`llm.extra_body={"response_format": {"type": "text"}}`, "llm.extra_body.response_format: "},
		{`llm.extra_body.chat_template_kwargs.enable_thinking=false`, "llm.extra_body: set it whole, as JSON text (from --set llm.extra_body.chat_template_kwargs.enable_thinking)"},
	} {
		if _, err := Load("", []string{tc.set}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.set, err, tc.want)
		}
	}
}
