// Package config is trace's configuration: one YAML file, overridden by
// environment variables (TRACE_ prefix, "__" between levels, e.g.
// TRACE_CLICKHOUSE__PASSWORD), overridden by flags (--set key=value).
// Defaults are explicit; Validate names the first bad field; Redacted hides
// every secret for printing.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	kmaps "github.com/knadh/koanf/maps"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"

	"github.com/traceops/trace/adapter/plan"
	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/gcpace"
	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/sink"
	"github.com/traceops/trace/synthesizer"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/envserver"
	"github.com/traceops/trace/verify"
)

// Config is the whole configuration of `trace run` and `trace demo`.
type Config struct {
	DataDir    string      `koanf:"data_dir"` // embedded servers keep their data here
	Roles      []string    `koanf:"roles"`    // ingest, analyze, adapt, serve
	Kafka      Kafka       `koanf:"kafka"`
	ClickHouse sink.Config `koanf:"clickhouse"`
	NATS       bus.Config  `koanf:"nats"`
	Analyzer   Analyzer    `koanf:"analyzer"`
	Adapter    Adapter     `koanf:"adapter"`
	// Verify is the closed loop (TRACE step 4): each adapter's effect on its
	// capability, and the guard the adapt role runs.
	Verify     verify.Config `koanf:"verify"`
	LLM        LLM           `koanf:"llm"`
	HTTP       HTTP          `koanf:"http"`
	Dictionary []string      `koanf:"dictionaries"` // YAML files applied at start (besides the built-in example)
	Embedded   Embedded      `koanf:"embedded"`
	// Synthesizer is the synthesize role (TRACE step 2): attempts, the
	// calibration run and its bands, the policy model of each cohort.
	Synthesizer synthesizer.Settings `koanf:"synthesizer"`
	// Env is the OpenEnv environment server of the serve role: it serves
	// the registry's DONE environments to trainers at /v1/environments.
	Env envserver.Config `koanf:"env"`
	// Programs bound every environment program the synthesize role
	// validates and calibrates and the serve role serves: steps, memory
	// and time per call, turns per episode, the reset cache. One section
	// for both roles, so that an environment is calibrated under the
	// limits it is served with.
	Programs envprog.Limits `koanf:"programs"`
	// Router is the route role (TRACE step 4): the router and its
	// OpenAI-compatible proxy on router.addr.
	Router Router `koanf:"router"`

	// verifyDeltaInherited: verify.delta was unset, so Load took
	// analyzer.delta's, and an error of it is analyzer.delta's.
	verifyDeltaInherited bool
}

// Embedded are the fixed loopback ports of the embedded servers, so that
// other trace commands (and kcat, nats, clickhouse-client) find a running
// `trace run`. 0 picks a free port.
type Embedded struct {
	ClickHousePort     int `koanf:"clickhouse_port"`      // native protocol, default 29000
	ClickHouseHTTPPort int `koanf:"clickhouse_http_port"` // default 28123
	NATSPort           int `koanf:"nats_port"`            // default 4222
}

// ClickHouseAddr is clickhouse.addr, or the embedded server's address.
func (c Config) ClickHouseAddr() []string {
	if len(c.ClickHouse.Addr) > 0 {
		return c.ClickHouse.Addr
	}
	return []string{fmt.Sprintf("127.0.0.1:%d", c.Embedded.ClickHousePort)}
}

// NATSURL is nats.url, or the embedded server's URL.
func (c Config) NATSURL() string {
	if c.NATS.URL != "" {
		return c.NATS.URL
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", c.Embedded.NATSPort)
}

// KafkaBrokers is kafka.brokers, or the embedded broker's address.
func (c Config) KafkaBrokers() []string {
	if len(c.Kafka.Brokers) > 0 {
		return c.Kafka.Brokers
	}
	return []string{c.Kafka.EmbeddedAddr}
}

// Kafka is where rollouts and labels come from.
type Kafka struct {
	// Brokers: empty starts an embedded Kafka-protocol broker (kfake) on
	// EmbeddedAddr with its data under data_dir/kafka. Production: real brokers.
	Brokers       []string      `koanf:"brokers"`
	EmbeddedAddr  string        `koanf:"embedded_addr"`
	RolloutsTopic string        `koanf:"rollouts_topic"`
	LabelsTopic   string        `koanf:"labels_topic"`
	DLQTopic      string        `koanf:"dlq_topic"`
	IngestGroup   string        `koanf:"ingest_group"`
	AnalyzeGroup  string        `koanf:"analyze_group"`
	LabelsGroup   string        `koanf:"labels_group"`
	BatchRows     int           `koanf:"batch_rows"`
	BatchBytes    int           `koanf:"batch_bytes"` // keys and values of one ingest batch
	BatchTimeout  time.Duration `koanf:"batch_timeout"`
	MaxBytes      int           `koanf:"max_message_bytes"`
	// AnalyzeDeadLetters makes the analyze stage dead-letter invalid
	// rollouts too. Off by default: the ingest stage reads the same topic
	// and dead-letters them, so each bad message lands in the DLQ once.
	// Turn it on when no ingest replica runs.
	AnalyzeDeadLetters bool `koanf:"analyze_dead_letters"`
	TLS                TLS  `koanf:"tls"`
	SASL               SASL `koanf:"sasl"`
	// SessionTimeout: how long a replica that died without leaving its
	// consumer group keeps its partitions unread before the group
	// coordinator hands them to the others (stream.Config.SessionTimeout).
	// RebalanceTimeout: how long a rebalance waits for the members. 30s
	// each by default; the broker bounds the session timeout
	// (group.min.session.timeout.ms, 6s by default).
	SessionTimeout   time.Duration `koanf:"session_timeout"`
	RebalanceTimeout time.Duration `koanf:"rebalance_timeout"`
}

// Message sizes follow kafka.max_message_bytes (M, 4 MiB by default): the
// largest rollout trace accepts; a larger one is dead-lettered (reason
// too_large) with its first M bytes.
//
// TopicMaxBytes (2M + 1 MiB) is the max.message.bytes of the embedded
// broker's topics and the consumers' fetch size (kafka-go MaxBytes): every
// rollout up to M is accepted uncompressed, and a rollout somewhat over M
// still reaches the ingest stage and is dead-lettered with its reason instead
// of being refused to its producer. Give the topics of a real cluster the
// same (or at least WriterBatchBytes).
//
// WriterBatchBytes (M + 1 MiB) is the kafka-go Writer.BatchBytes of trace's
// producers (dead letters, the demo, label events): a message of M bytes
// with its key and headers fits one batch, and no batch exceeds
// TopicMaxBytes even uncompressed.
func (k Kafka) TopicMaxBytes() int { return 2*k.MaxBytes + 1<<20 }

// WriterBatchBytes: see TopicMaxBytes.
func (k Kafka) WriterBatchBytes() int { return k.MaxBytes + 1<<20 }

// TLS settings of a client.
type TLS struct {
	Enabled    bool   `koanf:"enabled"`
	CAFile     string `koanf:"ca_file"`
	CertFile   string `koanf:"cert_file"`
	KeyFile    string `koanf:"key_file"`
	SkipVerify bool   `koanf:"skip_verify"`
}

// SASL settings of the Kafka client.
type SASL struct {
	Mechanism string `koanf:"mechanism"` // "", plain, scram-sha-256, scram-sha-512
	Username  string `koanf:"username"`
	Password  string `koanf:"password"` // secret
}

// Analyzer configures labeling and the trigger.
type Analyzer struct {
	analyzer.EvalConfig `koanf:",squash,flatten"` // squash: mapstructure (load), flatten: structs (defaults, print)
	Labeler             string                    `koanf:"labeler"`       // rules | llm | none (external labels only)
	SampleFailed        float64                   `koanf:"sample_failed"` // share of failed rollouts labeled by the llm labeler
	SamplePassed        float64                   `koanf:"sample_passed"` // share of passed rollouts labeled by the llm labeler
	Concurrency         int                       `koanf:"concurrency"`   // rollouts labeled at once
	// DefaultDictionary stores the built-in dictionary
	// (analyzer/dictionaries/tau-tools.yaml, environment "*") at start, so
	// that every (environment, agent version) without a dictionary of its
	// own is labeled with it. false: only dictionaries applied or discovered
	// label (a default stored earlier stays stored).
	DefaultDictionary bool `koanf:"default_dictionary"`
	// Discovery (needs llm.base_url): a scope without a dictionary, or whose
	// window has more than UnexplainedThreshold of its failures without any
	// LACKING label, gets a new dictionary version from the discovery agent,
	// at most once per DiscoveryCooldown.
	UnexplainedThreshold float64       `koanf:"unexplained_threshold"`
	DiscoveryCooldown    time.Duration `koanf:"discovery_cooldown"`
	DiscoverySample      int           `koanf:"discovery_sample"` // rollouts per outcome shown to the agent
}

// LLM is an OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, llama.cpp).
type LLM struct {
	BaseURL       string        `koanf:"base_url"`
	Model         string        `koanf:"model"`
	APIKey        string        `koanf:"api_key"` // secret; also OPENAI_API_KEY
	Timeout       time.Duration `koanf:"timeout"`
	Concurrency   int           `koanf:"concurrency"`
	RatePerSecond float64       `koanf:"rate_per_second"`
	Runs          int           `koanf:"runs"`
	Structured    string        `koanf:"structured_output"`
	// MaxTranscriptChars bounds the conversation in a labeling prompt
	// (analyzer.LLMLabelerConfig.MaxTranscriptChars): lower it for a model
	// whose context a long rollout's prompt exceeds (a 400
	// context_length_exceeded fails the run).
	MaxTranscriptChars int `koanf:"max_transcript_chars"`
	// ExtraBody are further top-level fields of every request of the llm.*
	// client (labeling, discovery, synthesis, the planner; the OpenAI
	// SDK's extra_body), e.g. chat_template_kwargs: {enable_thinking:
	// false} for a reasoning model whose thinking would use up the answer's
	// max_tokens: an object, in YAML a mapping, in TRACE_LLM__EXTRA_BODY or
	// --set JSON text. Read through Body. Default none.
	ExtraBody any `koanf:"extra_body"`
}

// Body is llm.extra_body as an object (nil when unset); an error naming
// the key when it is no object or sets a field the client sets itself
// (llm.OwnFields).
func (l LLM) Body() (map[string]any, error) {
	m, err := objectSetting("llm.extra_body", l.ExtraBody)
	if err != nil {
		return nil, err
	}
	if err := llm.CheckExtraBody("llm.extra_body", m); err != nil {
		return nil, err
	}
	return m, nil
}

// HTTP is the dashboard, metrics and health server.
type HTTP struct {
	Addr        string `koanf:"addr"`
	BearerToken string `koanf:"bearer_token"` // secret; protects the API and dashboard (not /healthz, /readyz, whose errors it shows only with it)
	// ReadyTimeout bounds each dependency check of /readyz (they run in
	// parallel), so a probe answers within about this long whatever is down.
	ReadyTimeout time.Duration `koanf:"ready_timeout"`
}

// Adapter configures the adapt role (TRACE step 3): the training plan and
// where jobs are dispatched.
type Adapter struct {
	// Backend: nats (jobs on JetStream for external trainer workers),
	// command (a command per job: the trainer itself, or a scheduler's
	// submit command), webhook (a signed HTTP POST of each spec), or none
	// (plans are recorded, nothing is dispatched).
	Backend string         `koanf:"backend"`
	Command CommandBackend `koanf:"command"`
	Webhook WebhookBackend `koanf:"webhook"`
	Plan    plan.Config    `koanf:"plan"`
	// DeadlineCheck is how often jobs are checked for silence.
	DeadlineCheck time.Duration `koanf:"deadline_check"`
	// Planner is the optional planning agent; Serving loads active
	// adapters into the serving engine (training.go).
	Planner Planner `koanf:"planner"`
	Serving Serving `koanf:"serving"`
	// AutoActivate activates every succeeded job's adapter (replacing the
	// active one of its environment and capability). Off: adapters stay
	// candidates until `trace adapters activate`.
	AutoActivate bool `koanf:"auto_activate"`
	// Simulated marks jobs for the demo's simulated trainer (set by
	// trace demo, not a user setting: no model is trained).
	Simulated bool `koanf:"-"`
}

// Roles trace run knows.
var Roles = []string{"ingest", "analyze", "synthesize", "adapt", "serve", "route"}

// DefaultRoles run when roles is not set: every role but route, which
// needs router.upstream_url and router.base_model.
var DefaultRoles = []string{"ingest", "analyze", "synthesize", "adapt", "serve"}

// The ingest stage's batch defaults (kafka.batch_*), from `trace bench
// ingest`: its batches stream into one INSERT each and cost no memory, and
// ClickHouse spends less CPU on fewer, larger inserts (parts and merges).
// Other stages cap theirs at stream.DefaultBatchRows / DefaultBatchBytes.
const (
	IngestBatchRows    = 10000
	IngestBatchBytes   = 256 << 20
	IngestBatchTimeout = time.Second
)

// Default is the configuration with every default filled in.
func Default() Config {
	return Config{
		DataDir: "./data",
		Roles:   slices.Clone(DefaultRoles),
		Kafka: Kafka{
			EmbeddedAddr: "127.0.0.1:9092", RolloutsTopic: "trace.rollouts", LabelsTopic: "trace.labels", DLQTopic: "trace.rollouts.dlq",
			IngestGroup: "trace-ingest", AnalyzeGroup: "trace-analyzer", LabelsGroup: "trace-labels",
			BatchRows: IngestBatchRows, BatchBytes: IngestBatchBytes, BatchTimeout: IngestBatchTimeout, MaxBytes: 4 << 20,
			SessionTimeout: 30 * time.Second, RebalanceTimeout: 30 * time.Second, // kafka-go's
		},
		ClickHouse: sink.Config{Database: "trace", User: "default", DialTimeout: 5 * time.Second, MaxOpenConns: 8, Compression: "auto"},
		NATS:       bus.Config{Duplicates: bus.DefaultDuplicates},
		// K and N stay 0 (unset): each cohort's follow its labels' source.
		Analyzer: Analyzer{Labeler: "rules", SampleFailed: 1, SamplePassed: 1, Concurrency: 8, DefaultDictionary: true,
			UnexplainedThreshold: analyzer.DefaultUnexplainedThreshold, DiscoveryCooldown: time.Hour, DiscoverySample: 10},
		LLM: LLM{Timeout: 60 * time.Second, Concurrency: 4, Runs: 10, Structured: "json_schema",
			MaxTranscriptChars: analyzer.DefaultMaxTranscriptChars},
		HTTP:        HTTP{Addr: "127.0.0.1:8080", ReadyTimeout: 2 * time.Second},
		Embedded:    Embedded{ClickHousePort: 29000, ClickHouseHTTPPort: 28123, NATSPort: 4222},
		Synthesizer: synthesizer.DefaultSettings(),
		Env:         envserver.DefaultConfig(),
		Programs:    envprog.DefaultLimits,
		Adapter: Adapter{Backend: "nats", Command: defaultCommandBackend(), Webhook: defaultWebhookBackend(), Plan: defaultPlan(),
			DeadlineCheck: 30 * time.Second, Planner: DefaultPlanner(), Serving: DefaultServing()},
		Router: DefaultRouter(),
		Verify: verifyDefaults(),
	}
}

// verifyDefaults are the closed loop's defaults but δ, which Load takes
// from analyzer.delta when verify.delta is unset: gap closed means the
// capability would no longer be selected, by the selection's own δ.
func verifyDefaults() verify.Config {
	c := verify.Config{Guard: true}.Defaults()
	c.Delta = 0
	return c
}

// Load builds the effective configuration: defaults, then the YAML file (if
// path is not empty), then TRACE_* environment variables, then overrides
// (key=value with dotted keys, from --set).
func Load(path string, overrides []string) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		return Config{}, err
	}
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return Config{}, fmt.Errorf("config file: %w", err)
		}
		if err := k.Load(file.Provider(path), yaml.Parser(), koanf.WithMergeFunc(mergeFile)); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
	}
	// Where each key of the environment and of --set came from, for the
	// message about an unknown one.
	origin := map[string]string{}
	if err := k.Load(env.Provider(".", env.Opt{Prefix: "TRACE_", TransformFunc: func(name, v string) (string, any) {
		key := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "TRACE_")), "__", ".")
		if top, _, _ := strings.Cut(key, "."); !slices.ContainsFunc(keyFields(reflect.TypeFor[Config]()), func(f keyField) bool {
			return strings.EqualFold(f.name, top)
		}) {
			// Not a setting: TRACE_CONFIG, the scripts' and test suite's
			// variables (TRACE_LLM_PORT, TRACE_TEST_…, TRACE_ENV_TOKEN).
			return "", nil
		}
		origin[key] = name
		if isList(key) {
			return key, splitList(v)
		}
		return key, v
	}}), nil); err != nil {
		return Config{}, err
	}
	if len(overrides) > 0 {
		m := map[string]any{}
		for _, o := range overrides {
			key, val, ok := strings.Cut(o, "=")
			if !ok || key == "" {
				return Config{}, fmt.Errorf("--set %q: want key=value", o)
			}
			origin[key] = "--set " + key // not its value: it may be a secret
			if isList(key) {
				m[key] = splitList(val)
			} else {
				m[key] = val
			}
		}
		if err := k.Load(confmap.Provider(m, "."), nil); err != nil {
			return Config{}, err
		}
	}
	// clickhouse.query_timeout: -1 turns the limit off (sink.Config), and
	// needs no unit; -1 of any unit (-1s) is the same.
	if noLimit(k.Get("clickhouse.query_timeout")) {
		if err := k.Load(confmap.Provider(map[string]any{"clickhouse.query_timeout": time.Duration(-1)}, "."), nil); err != nil {
			return Config{}, err
		}
	}
	// An extra_body's fields set one by one from the environment or --set
	// would all be strings ("false" is not false): it is set whole, as
	// JSON text, there.
	for _, key := range slices.Sorted(maps.Keys(origin)) {
		for _, body := range []string{"router.classifier_extra_body", "llm.extra_body"} {
			if strings.HasPrefix(strings.ToLower(key), body+".") {
				return Config{}, fmt.Errorf("%s: set it whole, as JSON text (from %s): e.g. %s={\"chat_template_kwargs\": {\"enable_thinking\": false}}; a field set alone would be a string", body, origin[key], body)
			}
		}
	}
	// A misspelled or misplaced key would be ignored by the decoder and
	// its setting would silently keep its default.
	if bad := unknownKeys(k.Raw(), reflect.TypeFor[Config](), ""); len(bad) > 0 {
		errs := make([]error, len(bad))
		for i, b := range bad {
			key, _, _ := strings.Cut(b, ":")
			if o, ok := origin[key]; ok {
				b += " (from " + o + ")"
			}
			errs[i] = errors.New(b)
		}
		return Config{}, errors.Join(errs...)
	}
	var c Config
	if err := k.UnmarshalWithConf("", &c, unmarshalConf()); err != nil {
		return Config{}, decodeErrors(err, origin)
	}
	// Unset K and N stay 0: each cohort's follow the source of its labels
	// (analyzer.EvalConfig.KOfN), whose llm labeler's runs are llm.runs.
	c.Analyzer.LLMRuns = c.LLM.Runs
	// Unset (zero) analyzer thresholds take the paper's defaults, and so
	// do ClickHouse's settings (query_timeout 10s, query_max_memory 1 GiB):
	// the configuration printed is the one in effect.
	c.Analyzer.EvalConfig = c.Analyzer.EvalConfig.WithDefaults()
	c.verifyDeltaInherited = c.Verify.Delta == 0
	c.Verify.Delta = cmp.Or(c.Verify.Delta, c.Analyzer.Delta)
	sel := c.Analyzer.EvalConfig
	c.Verify.Selection = &sel // the closed loop counts a rollout's runs as the selection does
	c.ClickHouse = c.ClickHouse.WithDefaults()
	c.LLM.APIKey = cmp.Or(c.LLM.APIKey, os.Getenv("OPENAI_API_KEY"))
	c.LLM.BaseURL = llm.NormalizeBaseURL(c.LLM.BaseURL) // http://host:8000 means its /v1
	return c, c.Validate()
}

// noLimitRe is -1 of a duration's unit, or of none.
var noLimitRe = regexp.MustCompile(`^\s*-1(ns|us|µs|μs|ms|s|m|h|d)?\s*$`)

// noLimit reports whether v, a duration setting as a layer gave it, is -1
// (of any unit, or of none): no limit.
func noLimit(v any) bool {
	switch x := v.(type) {
	case int:
		return x == -1
	case int64:
		return x == -1
	case float64:
		return x == -1
	case string:
		return noLimitRe.MatchString(x)
	}
	return false
}

// mergeFile merges the YAML file (src) into the defaults (dest). A section
// with no values (`kafka:` alone, or with only comments under it) is null
// in YAML, and would replace the section's defaults with nothing: it is
// left out, so that it keeps them.
func mergeFile(src, dest map[string]any) error {
	if err := dropNullSections(src, reflect.TypeFor[Config](), ""); err != nil {
		return err
	}
	kmaps.Merge(src, dest)
	return nil
}

// dropNullSections deletes the null values of m whose key is a section
// (a struct of t), at any depth, and names those of plain settings (but
// optional ones, which null leaves unset, and maps and values of any
// type, which it leaves empty; config print writes them so): a key
// with no value (`cache_ttl:`, often a template's empty variable) would be
// the setting's zero value (no TTL, no token, no brokers: embedded Kafka),
// not its default.
func dropNullSections(m map[string]any, t reflect.Type, prefix string) error {
	var errs []error
	fields := keyFields(t)
	for _, key := range slices.Sorted(maps.Keys(m)) {
		v := m[key]
		i := slices.IndexFunc(fields, func(f keyField) bool { return f.name == key })
		if i < 0 {
			continue // unknownKeys names it
		}
		optional := fields[i].typ.Kind() == reflect.Pointer // null: unset, as config print shows it
		ft := derefType(fields[i].typ)
		path := prefix + key
		switch {
		case v == nil && ft.Kind() == reflect.Struct:
			delete(m, key)
		case v == nil && !optional && ft.Kind() != reflect.Map && ft.Kind() != reflect.Interface: // a null map or value of any type is none
			errs = append(errs, fmt.Errorf("%s: no value (null in YAML): write one, or delete the line to keep the default (trace config print shows it)", path))
		default:
			eachSection(v, ft, func(sub map[string]any, st reflect.Type, at string) {
				errs = append(errs, dropNullSections(sub, st, path+at+"."))
			})
		}
	}
	return errors.Join(errs...)
}

// Validate names the first bad field.
func (c Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data_dir: must not be empty"))
	}
	for _, r := range c.Roles {
		if !slices.Contains(Roles, r) {
			errs = append(errs, fmt.Errorf("roles: unknown role %q (known: %s)", r, strings.Join(Roles, ", ")))
		}
	}
	if len(c.Roles) == 0 {
		errs = append(errs, errors.New("roles: at least one role is required"))
	}
	k := c.Kafka
	if len(k.Brokers) == 0 {
		if _, _, err := net.SplitHostPort(k.EmbeddedAddr); err != nil {
			errs = append(errs, fmt.Errorf("kafka.embedded_addr: %q is not host:port", k.EmbeddedAddr))
		}
	}
	for _, b := range k.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			errs = append(errs, fmt.Errorf("kafka.brokers: %q is not host:port", b))
		}
	}
	for name, v := range map[string]string{"kafka.rollouts_topic": k.RolloutsTopic, "kafka.labels_topic": k.LabelsTopic, "kafka.dlq_topic": k.DLQTopic,
		"kafka.ingest_group": k.IngestGroup, "kafka.analyze_group": k.AnalyzeGroup, "kafka.labels_group": k.LabelsGroup} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s: must not be empty", name))
		} else if strings.HasSuffix(name, "_topic") {
			if err := CheckTopic(name, v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// The labels stage dead-letters to kafka.labels_topic + ".dlq".
	if k.LabelsTopic != "" && CheckTopic("kafka.labels_topic", k.LabelsTopic) == nil {
		if dlq := k.LabelsTopic + ".dlq"; CheckTopic("", dlq) != nil {
			errs = append(errs, fmt.Errorf("kafka.labels_topic: its dead letters' topic %q is not a Kafka topic name (at most 249 characters)", dlq))
		}
	}
	// Each consumer needs a topic and a group of its own: the ingest and
	// analyze stages both read rollouts_topic, so one group would split its
	// partitions between them (the rollouts the analyzer read would never
	// be stored), and dead letters or labels written to a topic a consumer
	// reads would come back to it.
	if k.RolloutsTopic != "" && k.LabelsTopic == k.RolloutsTopic {
		errs = append(errs, fmt.Errorf("kafka.labels_topic: %q is also kafka.rollouts_topic", k.LabelsTopic))
	}
	if k.DLQTopic != "" && (k.DLQTopic == k.RolloutsTopic || k.DLQTopic == k.LabelsTopic) {
		errs = append(errs, fmt.Errorf("kafka.dlq_topic: %q is also the topic of rollouts or labels", k.DLQTopic))
	}
	if k.IngestGroup != "" && k.AnalyzeGroup == k.IngestGroup {
		errs = append(errs, fmt.Errorf("kafka.analyze_group: %q is also kafka.ingest_group; both read kafka.rollouts_topic and one group would split its partitions between them", k.AnalyzeGroup))
	}
	if k.BatchRows < 1 {
		errs = append(errs, fmt.Errorf("kafka.batch_rows: must be >= 1, got %d", k.BatchRows))
	}
	if k.BatchBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("kafka.batch_bytes: must be >= 1048576 (1 MiB), got %d", k.BatchBytes))
	}
	if k.BatchTimeout <= 0 {
		errs = append(errs, fmt.Errorf("kafka.batch_timeout: must be positive, got %s", k.BatchTimeout))
	}
	if k.SessionTimeout < time.Second {
		errs = append(errs, fmt.Errorf("kafka.session_timeout: must be at least 1s (the broker's group.min.session.timeout.ms is 6s by default), got %s", k.SessionTimeout))
	}
	if k.RebalanceTimeout < time.Second {
		errs = append(errs, fmt.Errorf("kafka.rebalance_timeout: must be at least 1s, got %s", k.RebalanceTimeout))
	}
	if k.MaxBytes < 1024 || k.MaxBytes > 256<<20 {
		errs = append(errs, fmt.Errorf("kafka.max_message_bytes: must be in [1024, 268435456] (256 MiB), got %d", k.MaxBytes))
	}
	switch k.SASL.Mechanism {
	case "", "plain", "scram-sha-256", "scram-sha-512":
	default:
		errs = append(errs, fmt.Errorf("kafka.sasl.mechanism: %q is not plain, scram-sha-256 or scram-sha-512", k.SASL.Mechanism))
	}
	if k.SASL.Mechanism != "" && k.SASL.Username == "" {
		errs = append(errs, errors.New("kafka.sasl.username: required with a SASL mechanism"))
	}
	// The embedded server (no clickhouse.addr) takes the same settings,
	// checked here against its address rather than after it has started.
	ch := c.ClickHouse
	ch.Addr = c.ClickHouseAddr()
	if err := ch.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := checkNATSURL(c.NATS.URL); err != nil {
		errs = append(errs, err)
	}
	if err := c.NATS.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range []struct {
		key  string
		port int
	}{{"embedded.clickhouse_port", c.Embedded.ClickHousePort}, {"embedded.clickhouse_http_port", c.Embedded.ClickHouseHTTPPort}, {"embedded.nats_port", c.Embedded.NATSPort}} {
		if p.port < 0 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("%s: %d is not a TCP port (0–65535; 0 picks a free one)", p.key, p.port))
		}
	}
	if err := c.Analyzer.EvalConfig.WithDefaults().Validate(); err != nil {
		errs = append(errs, err)
	} else if an := c.Analyzer; an.K > 0 && an.N == 0 {
		// analyzer.k alone: the configured labeler's cohorts (external
		// labels' with none) must be able to pass it.
		if kn := an.EvalConfig.WithDefaults().KOfN([]string{analyzer.LabelerSource(an.Labeler)}); kn.N < kn.K {
			errs = append(errs, fmt.Errorf("analyzer.n: %d, the runs of analyzer.labeler %s, is less than analyzer.k %d (set analyzer.n)", kn.N, an.Labeler, kn.K))
		}
	}
	switch c.Analyzer.Labeler {
	case "rules", "none":
	case "llm":
		if c.LLM.BaseURL == "" {
			errs = append(errs, errors.New("llm.base_url: required with analyzer.labeler: llm"))
		}
		if c.LLM.Model == "" {
			errs = append(errs, errors.New("llm.model: required with analyzer.labeler: llm"))
		}
	default:
		errs = append(errs, fmt.Errorf("analyzer.labeler: %q is not rules, llm or none", c.Analyzer.Labeler))
	}
	// The LLM client checks these too, when a role first makes it, under
	// its Go names; here they fail at start under their keys.
	if c.LLM.Timeout < 0 {
		errs = append(errs, fmt.Errorf("llm.timeout: must be positive, got %s", c.LLM.Timeout))
	}
	if c.LLM.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("llm.concurrency: must be at least 1, got %d", c.LLM.Concurrency))
	}
	if !(c.LLM.RatePerSecond >= 0) { // NaN too
		errs = append(errs, fmt.Errorf("llm.rate_per_second: must be >= 0 (0: unlimited), got %v", c.LLM.RatePerSecond))
	}
	if c.LLM.Runs < 0 || c.LLM.Runs > 100 {
		errs = append(errs, fmt.Errorf("llm.runs: must be in [1, 100], got %d", c.LLM.Runs))
	}
	if _, err := c.LLM.Body(); err != nil {
		errs = append(errs, err)
	}
	if c.LLM.MaxTranscriptChars < analyzer.MinTranscriptChars {
		errs = append(errs, fmt.Errorf("llm.max_transcript_chars: must be at least %d, got %d", analyzer.MinTranscriptChars, c.LLM.MaxTranscriptChars))
	}
	switch llm.StructuredOutput(c.LLM.Structured) {
	case "", llm.StructuredJSONSchema, llm.StructuredJSONObject, llm.StructuredJSONObjectSchema, llm.StructuredNone:
	default:
		errs = append(errs, fmt.Errorf("llm.structured_output: %q is not json_schema, json_object, json_object_schema or none", c.LLM.Structured))
	}
	if c.Analyzer.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("analyzer.concurrency: must be at least 1, got %d", c.Analyzer.Concurrency))
	}
	for name, v := range map[string]float64{"analyzer.sample_failed": c.Analyzer.SampleFailed, "analyzer.sample_passed": c.Analyzer.SamplePassed,
		"analyzer.unexplained_threshold": c.Analyzer.UnexplainedThreshold} {
		if v < 0 || v > 1 {
			errs = append(errs, fmt.Errorf("%s: must be in [0, 1], got %v", name, v))
		}
	}
	if err := c.validateBackend(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Adapter.Plan.Validate("adapter.plan."); err != nil {
		errs = append(errs, err)
	}
	v := c.Verify.Defaults()
	if c.verifyDeltaInherited {
		// verify.delta is analyzer.delta's: out of [-1, 1] its error is
		// analyzer.delta's (above); in it but not in (0, 1] it is a δ the
		// selection takes that the closed loop cannot (it needs a gap to
		// call closed), said so here.
		if d := c.Analyzer.Delta; d >= -1 && d <= 1 && !(d > 0) {
			errs = append(errs, fmt.Errorf("verify.delta: unset, so analyzer.delta's %v, which the closed loop cannot use (it needs a δ in (0, 1]): set verify.delta", d))
		}
		v.Delta = analyzer.DefaultThresholds.Delta // checked above
	}
	if err := v.Validate("verify."); err != nil {
		errs = append(errs, err)
	}
	if c.Adapter.DeadlineCheck <= 0 {
		errs = append(errs, fmt.Errorf("adapter.deadline_check: must be positive, got %s", c.Adapter.DeadlineCheck))
	}
	errs = append(errs, c.validateTraining()...)
	if _, _, err := net.SplitHostPort(c.HTTP.Addr); err != nil {
		errs = append(errs, fmt.Errorf("http.addr: %q is not host:port", c.HTTP.Addr))
	}
	if c.HTTP.ReadyTimeout <= 0 || c.HTTP.ReadyTimeout > time.Minute {
		errs = append(errs, fmt.Errorf("http.ready_timeout: must be in (0, 1m], got %s", c.HTTP.ReadyTimeout))
	}
	for _, f := range c.Dictionary {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("dictionaries: %w", err))
		}
	}
	if err := c.Synthesizer.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Env.Validate(); err != nil {
		errs = append(errs, err)
	}
	// Checked as sandboxed: both roles run generated programs in the
	// sandbox worker, which holds the reset cache under max_memory.
	if err := c.Programs.Check(func(key string) string { return "programs." + key }, true); err != nil {
		errs = append(errs, err)
	}
	if c.Has("route") {
		if err := c.Router.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Redacted returns a copy with every secret replaced, for printing and logs.
func (c Config) Redacted() Config {
	r := c
	red := func(s *string) {
		if *s != "" {
			*s = "[REDACTED]"
		}
	}
	red(&r.Kafka.SASL.Password)
	red(&r.ClickHouse.Password)
	red(&r.NATS.Token)
	red(&r.LLM.APIKey)
	red(&r.Env.BearerToken)
	red(&r.HTTP.BearerToken)
	red(&r.Adapter.Serving.Token)
	red(&r.Adapter.Webhook.Secret)
	red(&r.Adapter.Webhook.BearerToken)
	red(&r.Adapter.Webhook.CallbackToken)
	red(&r.Router.UpstreamAPIKey)
	red(&r.Router.BearerToken)
	red(&r.Router.ClassifierAPIKey)
	red(&r.Router.Retrieval.APIKey)
	r.Synthesizer.Policies = slices.Clone(c.Synthesizer.Policies)
	for i := range r.Synthesizer.Policies {
		red(&r.Synthesizer.Policies[i].APIKey)
		r.Synthesizer.Policies[i].BaseURL = bus.RedactURLs(r.Synthesizer.Policies[i].BaseURL)
	}
	// The command backend's environment often carries a token
	// (HF_TOKEN=…): its names are shown, not its values.
	r.Adapter.Command.Env = slices.Clone(c.Adapter.Command.Env)
	for i, kv := range r.Adapter.Command.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && v != "" {
			r.Adapter.Command.Env[i] = k + "=[REDACTED]"
		}
	}
	// A password can also sit in a URL (https://user:pass@host/).
	for _, u := range []*string{&r.NATS.URL, &r.LLM.BaseURL, &r.Adapter.Serving.BaseURL, &r.Adapter.Webhook.URL,
		&r.Adapter.Webhook.CallbackURL, &r.Adapter.Plan.EnvServerURL, &r.Router.UpstreamURL, &r.Router.ClassifierURL,
		&r.Router.Retrieval.EmbeddingsURL} {
		*u = bus.RedactURLs(*u)
	}
	return r
}

// Path joins a path under the data directory.
func (c Config) Path(elem ...string) string {
	return filepath.Join(append([]string{c.DataDir}, elem...)...)
}

// Has reports whether a role is enabled.
func (c Config) Has(role string) bool { return slices.Contains(c.Roles, role) }

// GCPolicy is how a process with this configuration paces its garbage
// collector, and the settings it comes from; the zero Policy (Go's own)
// for none. A process that runs one role alone whose live heap is small
// and whose garbage is plentiful sets that role's: the route role
// router.gogc with router.gc_headroom_mb, the serve role env.gogc. GOGC
// in the environment (envGOGC) always wins, and a process with several
// roles keeps Go's setting.
func (c Config) GCPolicy(envGOGC string) (p gcpace.Policy, setting string) {
	if envGOGC != "" || len(c.Roles) == 0 || slices.ContainsFunc(c.Roles, func(r string) bool { return r != c.Roles[0] }) {
		return gcpace.Policy{}, ""
	}
	switch c.Roles[0] {
	case "route":
		return gcpace.Policy{Percent: c.Router.GOGC, Headroom: uint64(c.Router.GCHeadroomMB) << 20}, "router.gogc, router.gc_headroom_mb"
	case "serve":
		return gcpace.Policy{Percent: c.Env.GOGC}, "env.gogc"
	}
	return gcpace.Policy{}, ""
}

// defaultPlan is the training plan's defaults with no environment server
// URL: `trace run` points jobs at its own serve role (Config.EnvServerURL).
func defaultPlan() plan.Config {
	p := plan.DefaultConfig()
	p.EnvServerURL = ""
	return p
}

// EnvServerURL is adapter.plan.env_server_url, or where this trace's serve
// role serves environments: http://<env.addr>, else http://<http.addr>. An
// address listening on every interface (":8080", "0.0.0.0:8080",
// "[::]:8080") is reached on this machine's loopback: it names no host a
// trainer could connect to (trainers elsewhere need env_server_url).
func (c Config) EnvServerURL() string {
	if c.Adapter.Plan.EnvServerURL != "" {
		return c.Adapter.Plan.EnvServerURL
	}
	addr := cmp.Or(c.Env.Addr, c.HTTP.Addr)
	if host, port, err := net.SplitHostPort(addr); err == nil {
		if host == "" || host == "0.0.0.0" {
			addr = net.JoinHostPort("127.0.0.1", port)
		} else if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			addr = net.JoinHostPort("::1", port)
		}
	}
	return "http://" + addr
}

// natsSchemes are the URL schemes nats.go connects with.
var natsSchemes = []string{"nats", "tls", "ws", "wss"}

// CheckTopic refuses a topic name that Kafka refuses (InvalidTopicException:
// 1 to 249 characters of ASCII letters, digits, '.', '_' and '-', neither
// "." nor ".."), naming the setting; the embedded broker (kfake) takes any
// name, so such a name would fail only on a real cluster.
func CheckTopic(name, v string) error {
	ok := v != "" && len(v) <= 249 && v != "." && v != ".."
	for i := 0; ok && i < len(v); i++ {
		c := v[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("%s: %q is not a Kafka topic name (1–249 characters of a-z, A-Z, 0-9, '.', '_' and '-'; not . or ..)", name, v)
	}
	return nil
}

// checkNATSURL checks nats.url: empty (the embedded server), or a
// comma-separated list of server URLs (nats.go's form for a cluster), each
// with a scheme nats.go speaks. Credentials in a URL are not shown.
func checkNATSURL(v string) error {
	if v == "" {
		return nil
	}
	for _, u := range strings.Split(v, ",") {
		u = strings.TrimSpace(u)
		scheme, rest, ok := strings.Cut(u, "://")
		shown := u
		if i := strings.LastIndex(u, "@"); i >= 0 { // credentials, with a scheme or without
			shown = "[REDACTED]@" + u[i+1:]
			if ok {
				shown = scheme + "://" + shown
			}
		}
		if !ok || !slices.Contains(natsSchemes, strings.ToLower(scheme)) || rest == "" {
			return fmt.Errorf("nats.url: %q is not a URL like nats://host:4222 (schemes: %s; several servers separated by commas)", shown, strings.Join(natsSchemes, ", "))
		}
	}
	return nil
}
