package router

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/prompts"
)

// Classifier is the base model behind the OpenAI-compatible API
// (*llm.Client). Chat must honour ctx.
type Classifier interface {
	Chat(ctx context.Context, req llm.Request) (llm.Response, error)
	Model() string
}

// AdapterSource lists the adapters a conversation may be routed to: the
// registry's active adapters of an environment (and agent version, when the
// registry scopes them by it). Safe for concurrent use.
type AdapterSource interface {
	ActiveAdapters(ctx context.Context, environment, agentVersion string) ([]Candidate, error)
}

// ListedAdapterSource is an AdapterSource that keeps its lists for a while
// (Registry) and says when the list it returns was read. The router then
// checks its cached decisions against lists at most
// Config.AdaptersRefresh old; with a plain AdapterSource, the time it
// asked counts as the time of the list.
type ListedAdapterSource interface {
	AdapterSource
	ActiveAdaptersAt(ctx context.Context, environment, agentVersion string) ([]Candidate, time.Time, error)
}

// Label constraints (router.label_constraint): how the classifier's
// output is restricted to the labels besides the prompt.
const (
	ConstraintNone              = "none"               // the prompt only (llama.cpp, OpenAI)
	ConstraintStructuredOutputs = "structured_outputs" // vLLM: structured_outputs: {choice: [labels]}
)

// Config of a Router. Zero fields take the defaults of WithDefaults.
type Config struct {
	// BaseModel is the upstream's served name of the base model: the
	// "model" of conversations routed to no adapter.
	BaseModel string
	// TopP: the decision rule's p (default 0.95; a negative value records
	// the top adapter alone).
	TopP float64
	// Temperature is the classifier temperature of the renormalisation
	// (default 1.0).
	Temperature float64
	// TopLogprobs is the number of alternatives asked for (1–20, default 20).
	TopLogprobs int
	// Context is ContextFirstUser (default) or ContextLastN with LastN turns (default 4).
	Context string
	LastN   int
	// ContextMaxChars bounds the characters of those turns the classifier
	// is shown (default DefaultContextMaxChars; negative: no bound), see
	// CapContext.
	ContextMaxChars int
	// CacheTTL keeps a conversation's decision (default 1h; negative: no
	// cache, every request is classified, router.cache_ttl 0); CacheMax
	// bounds the conversations held (default 100,000).
	CacheTTL time.Duration
	CacheMax int
	// AdaptersRefresh (default 10s) is how often a cached decision's
	// adapter is checked against its environment's active adapters (a
	// cached decision whose adapter left the list is dropped and the
	// conversation classified again), and how long a decision that
	// records an error (ReasonClassifierError, ReasonRegistryError) or
	// had nothing to classify (ReasonNoMessages) is cached, at most
	// CacheTTL: a passing failure does not pin a conversation to the base
	// model for CacheTTL.
	AdaptersRefresh time.Duration
	// LabelConstraint is ConstraintNone (default) or ConstraintStructuredOutputs.
	LabelConstraint string
	// ClassifierAttempts bounds the classifier's HTTP attempts per
	// decision (default 2: routing waits on it).
	ClassifierAttempts int
	// ClassifierExtraBody are further top-level fields of every classifier
	// request (router.classifier_extra_body; the OpenAI SDK's extra_body),
	// e.g. {"chat_template_kwargs": {"enable_thinking": false}} so that a
	// reasoning model (Qwen3 on vLLM or llama.cpp) answers the label
	// rather than "<think>". None of ClassifierOwnFields. Read only.
	ClassifierExtraBody map[string]any
	// DecisionTimeout bounds a whole new decision (default 30s): the
	// registry read, the retrieval, the wait for a classifier slot, every
	// attempt and the waits between them. Past it the decision is the
	// base model with ReasonClassifierError, so an overloaded classifier
	// does not hold new conversations for longer.
	DecisionTimeout time.Duration
	// Retriever, when set, shows each candidate with its most similar
	// successful trajectory (TRACE's retrieval variant); nil: off.
	Retriever *Retriever
	// Prompts resolves prompts/route.md (nil: the embedded one).
	Prompts *prompts.Set
	Logger  *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// ClassifierOwnFields are the classifier request's fields that the router
// and its client set themselves (the one-token question, its logprobs,
// structured_outputs with router.label_constraint), or that would change
// the answer's form (stream, response_format, OpenAI's newer name for
// max_tokens): Config.ClassifierExtraBody must not set them.
var ClassifierOwnFields = []string{"model", "messages", "temperature", "max_tokens", "max_completion_tokens",
	"logprobs", "top_logprobs", "stream", "response_format", "structured_outputs"}

// CheckClassifierExtraBody names the first field of extra that the router
// sets itself (ClassifierOwnFields), as router.classifier_extra_body.<key>.
func CheckClassifierExtraBody(extra map[string]any) error {
	return llm.CheckOwnFields("router.classifier_extra_body", "the router", ClassifierOwnFields, extra)
}

// DefaultDecisionTimeout is Config.DecisionTimeout's default.
const DefaultDecisionTimeout = 30 * time.Second

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.TopP == 0 {
		c.TopP = 0.95
	}
	if c.Temperature == 0 {
		c.Temperature = 1
	}
	if c.TopLogprobs == 0 {
		c.TopLogprobs = 20
	}
	if c.Context == "" {
		c.Context = ContextFirstUser
	}
	if c.ContextMaxChars == 0 {
		c.ContextMaxChars = DefaultContextMaxChars
	}
	if c.LastN == 0 {
		c.LastN = 4
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = time.Hour
	}
	if c.AdaptersRefresh == 0 {
		c.AdaptersRefresh = 10 * time.Second
	}
	if c.LabelConstraint == "" {
		c.LabelConstraint = ConstraintNone
	}
	if c.ClassifierAttempts == 0 {
		c.ClassifierAttempts = 2
	}
	if c.DecisionTimeout == 0 {
		c.DecisionTimeout = DefaultDecisionTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate names the first bad field (as router.<field>).
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("router.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if strings.TrimSpace(c.BaseModel) == "" {
		bad("base_model", "is required (the upstream's served name of the base model)")
	}
	if c.TopP > 1 || math.IsNaN(c.TopP) {
		bad("top_p", "must be at most 1, got %v", c.TopP)
	}
	if c.Temperature <= 0 || math.IsNaN(c.Temperature) || math.IsInf(c.Temperature, 0) {
		bad("temperature", "must be positive, got %v", c.Temperature)
	}
	if c.TopLogprobs < 1 || c.TopLogprobs > 20 {
		bad("top_logprobs", "must be in [1, 20], got %d", c.TopLogprobs)
	}
	switch c.Context {
	case ContextFirstUser, ContextLastN:
	default:
		bad("context", "must be first_user or last_n, got %q", c.Context)
	}
	if c.LastN < 1 {
		bad("last_n", "must be at least 1, got %d", c.LastN)
	}
	if c.AdaptersRefresh < 0 {
		bad("adapters_refresh", "must be positive, got %s", c.AdaptersRefresh)
	}
	switch c.LabelConstraint {
	case ConstraintNone, ConstraintStructuredOutputs:
	default:
		bad("label_constraint", "must be none or structured_outputs, got %q", c.LabelConstraint)
	}
	if c.DecisionTimeout < 0 {
		bad("decision_timeout", "must be positive, got %s", c.DecisionTimeout)
	}
	if c.ClassifierAttempts < 1 || c.ClassifierAttempts > llm.MaxAttemptsLimit {
		bad("classifier_attempts", "must be in [1, %d], got %d", llm.MaxAttemptsLimit, c.ClassifierAttempts)
	}
	if err := CheckClassifierExtraBody(c.ClassifierExtraBody); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Input is one routing question: a conversation of an environment.
type Input struct {
	ConversationID string
	// ConversationSource says where the id came from (header, metadata,
	// request, hash).
	ConversationSource string
	Environment        string
	AgentVersion       string
	Turns              []Turn
}

// Decision is a routing decision, as cached and recorded.
type Decision struct {
	ID                 string
	At                 time.Time
	ConversationID     string
	ConversationSource string
	Environment        string
	AgentVersion       string
	// Adapter is the chosen adapter's served name, "" for the base model;
	// Model is the "model" the upstream is asked for (the adapter or the
	// base model).
	Adapter    string
	Capability string
	Model      string
	Label      string
	Labels     []Label
	// Probabilities per label (nil without a classification).
	Probabilities map[string]float64
	Weights       []Weight
	// Reason is ReasonClassified or why the base model was used without
	// probabilities; Error the classifier's error text then.
	Reason          string
	Error           string
	ClassifierModel string
	ClassifyLatency time.Duration
	// Examples are the retrieved trajectories shown, rollout id by
	// capability (retrieval only).
	Examples map[string]string

	wire *wire // made once for a cached decision (see wireOf)
	// labels is Labels with its wire columns, shared read-only by the
	// decisions made from one list of active adapters (set with Labels by
	// classify; nil for a Decision made otherwise).
	labels *labelSet
	// active is the list of the environment's active adapters Adapter was
	// chosen from, checked when the decision is served from the cache
	// (see Router.stillActive).
	active *activeList
}

// activeList is an (environment, agent version)'s active adapters as the
// router last read them, shared by its cached decisions. Read with one
// atomic load; replaced whole, at most once per Config.AdaptersRefresh.
type activeList struct {
	snap       atomic.Pointer[activeSnap]
	refreshing atomic.Bool // one request re-reads it; the others use the last
	// labels is the labels of the list the last classification saw, shared
	// by the decisions made from the same list (see labelsOf).
	labels atomic.Pointer[labelSet]
}

type activeSnap struct {
	adapters map[string]struct{}
	next     time.Time // when the list is to be read again
}

// activeCheckTimeout bounds the read of a list of active adapters made
// for a cached decision's check.
const activeCheckTimeout = 5 * time.Second

// Router makes and caches decisions. Safe for concurrent use.
type Router struct {
	cfg      Config
	cls      Classifier
	adapters AdapterSource
	tmpl     *template.Template
	cache    *Cache
	group    singleflight.Group
	log      *slog.Logger

	activeMu sync.Mutex
	active   map[string]*activeList // by environment "\x00" agent version
}

// New returns a router. cls may be nil only when no environment ever has
// an active adapter (every decision is then ReasonNoAdapters).
func New(cfg Config, cls Classifier, adapters AdapterSource) (*Router, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if adapters == nil {
		return nil, errors.New("router: no adapter source")
	}
	ps := cfg.Prompts
	if ps == nil {
		ps = prompts.Default()
	}
	t, err := ps.Template(prompts.Route)
	if err != nil {
		return nil, err
	}
	if t.Lookup("system") == nil || t.Lookup("user") == nil {
		return nil, fmt.Errorf("router: prompt %s must define the templates \"system\" and \"user\"", prompts.Route)
	}
	return &Router{cfg: cfg, cls: cls, adapters: adapters, tmpl: t,
		cache: NewCache(cfg.CacheTTL, cfg.CacheMax, cfg.Now), log: cfg.Logger}, nil
}

// Config is the effective configuration.
func (r *Router) Config() Config { return r.cfg }

// Route returns the conversation's decision: the cached one while it is
// fresh (cached true), else a new classification, which is cached. It
// never fails: whatever goes wrong routes to the base model with the
// reason in the decision. Concurrent first requests of one conversation
// share one classification.
func (r *Router) Route(ctx context.Context, in Input) (d Decision, cached bool) {
	key := in.Environment + "\x00" + in.ConversationID
	if d, ok := r.cached(key); ok {
		return d, true
	}
	classified := false // set only in the one call that runs the classification
	v, _, _ := r.group.Do(key, func() (any, error) {
		if d, ok := r.cached(key); ok {
			return d, nil
		}
		// Not cancelled with the request that runs it (the conversation's
		// other requests share it), but bounded as a whole.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.DecisionTimeout)
		d := r.classify(dctx, in)
		cancel()
		d.wire = newWire(d)
		classified = true
		r.cache.PutTTL(key, d, r.cacheTTL(d))
		return d, nil
	})
	return v.(Decision), !classified
}

// cacheTTL is how long d is cached: AdaptersRefresh for a decision that
// records an error (the next request after it tries again) or that had no
// text to classify (a named conversation whose first request was audio or
// images only: a later one may have text), CacheTTL for the others.
func (r *Router) cacheTTL(d Decision) time.Duration {
	switch d.Reason {
	case ReasonClassifierError, ReasonRegistryError, ReasonNoMessages:
		return min(r.cfg.AdaptersRefresh, r.cfg.CacheTTL)
	}
	return r.cfg.CacheTTL
}

// Lookup returns a conversation's cached decision while it is fresh and
// its adapter, if any, is still active (see Route).
func (r *Router) Lookup(environment, conversationID string) (Decision, bool) {
	return r.cached(environment + "\x00" + conversationID)
}

// cached is the cache's decision for key while its adapter is still
// active; a decision whose adapter is not is dropped.
func (r *Router) cached(key string) (Decision, bool) {
	d, ok := r.cache.Get(key)
	if !ok {
		return d, false
	}
	if !r.stillActive(&d) {
		r.cache.Remove(key, d.ID)
		r.log.Info("router: the cached decision's adapter is no longer active; classifying the conversation again",
			"environment", d.Environment, "conversation_id", d.ConversationID, "adapter", d.Adapter)
		return Decision{}, false
	}
	return d, true
}

// stillActive reports whether d names no adapter or one in the list of
// its environment's active adapters. On the path of every cached request:
// an atomic load and a map lookup, and, once per AdaptersRefresh, the
// re-read of the list by the one request that finds it due (the others
// meanwhile use the last). A failed re-read keeps the last list.
func (r *Router) stillActive(d *Decision) bool {
	if d.Adapter == "" || d.active == nil {
		return true
	}
	s := d.active.snap.Load()
	if now := r.cfg.Now(); !now.Before(s.next) && d.active.refreshing.CompareAndSwap(false, true) {
		s = r.refreshActive(d.active, d.Environment, d.AgentVersion, now)
		d.active.refreshing.Store(false)
	}
	_, ok := s.adapters[d.Adapter]
	return ok
}

// refreshActive re-reads l; on failure the last list is kept until the
// next interval.
func (r *Router) refreshActive(l *activeList, environment, agentVersion string, now time.Time) *activeSnap {
	ctx, cancel := context.WithTimeout(context.Background(), activeCheckTimeout)
	defer cancel()
	cands, at, err := r.activeAdapters(ctx, environment, agentVersion)
	if err != nil {
		r.log.Warn("router: adapter registry unavailable; cached decisions keep their adapters", "environment", environment, "err", err)
		s := &activeSnap{adapters: l.snap.Load().adapters, next: now.Add(r.cfg.AdaptersRefresh)}
		l.snap.Store(s)
		return s
	}
	return r.observe(l, cands, at, now)
}

// activeAdapters reads the source's list and when it was read.
func (r *Router) activeAdapters(ctx context.Context, environment, agentVersion string) ([]Candidate, time.Time, error) {
	if ls, ok := r.adapters.(ListedAdapterSource); ok {
		return ls.ActiveAdaptersAt(ctx, environment, agentVersion)
	}
	cands, err := r.adapters.ActiveAdapters(ctx, environment, agentVersion)
	return cands, r.cfg.Now(), err
}

// labelSet is the labels of one list of active adapters, with the columns
// of route_decisions they make, built once per list: every decision made
// from the list shares them read-only, so a cached conversation does not
// hold a copy of its environment's labels (BenchmarkCachedDecisionMemory).
type labelSet struct {
	cands                 []Candidate // the list, as the registry gave it
	labels                []Label
	names, caps, adapters []string
}

// labelsOf is the labels of cands, the active adapters of l's environment
// and agent version: the set the last classification made when the list
// is the same, else a new one.
func (r *Router) labelsOf(l *activeList, cands []Candidate, environment string) *labelSet {
	if ls := l.labels.Load(); ls != nil && slices.Equal(ls.cands, cands) {
		return ls
	}
	labels, dropped := AssignLabels(cands)
	if len(dropped) > 0 {
		r.log.Warn("router: more active adapters than labels; some are never chosen", "environment", environment, "dropped", len(dropped))
	}
	ls := newLabelSet(slices.Clone(cands), labels)
	l.labels.Store(ls)
	return ls
}

// newLabelSet is labels, made from cands, with their columns.
func newLabelSet(cands []Candidate, labels []Label) *labelSet {
	ls := &labelSet{cands: cands, labels: labels,
		names: make([]string, len(labels)), caps: make([]string, len(labels)), adapters: make([]string, len(labels))}
	for i, lb := range labels {
		ls.names[i], ls.caps[i], ls.adapters[i] = lb.Name, lb.Capability(), lb.Candidate.Adapter
	}
	return ls
}

// activeListOf is the (environment, agent version)'s list, made on first use.
func (r *Router) activeListOf(environment, agentVersion string) *activeList {
	key := environment + "\x00" + agentVersion
	r.activeMu.Lock()
	defer r.activeMu.Unlock()
	l, ok := r.active[key]
	if !ok {
		if r.active == nil {
			r.active = map[string]*activeList{}
		}
		l = &activeList{}
		l.snap.Store(&activeSnap{})
		r.active[key] = l
	}
	return l
}

// observe makes cands, read at `at`, l's list: due again AdaptersRefresh
// after it was read, or after now when that is past already (a source
// serving an old list because its reads fail: it is asked again an
// interval later, not per request).
func (r *Router) observe(l *activeList, cands []Candidate, at, now time.Time) *activeSnap {
	s := &activeSnap{adapters: make(map[string]struct{}, len(cands)), next: at.Add(r.cfg.AdaptersRefresh)}
	if !s.next.After(now) {
		s.next = now.Add(r.cfg.AdaptersRefresh)
	}
	for _, c := range cands {
		s.adapters[c.Adapter] = struct{}{}
	}
	l.snap.Store(s)
	return s
}

// classify makes a new decision.
func (r *Router) classify(ctx context.Context, in Input) Decision {
	d := Decision{ID: NewID(), At: r.cfg.Now().UTC(), ConversationID: in.ConversationID, ConversationSource: in.ConversationSource,
		Environment: in.Environment, AgentVersion: in.AgentVersion, Model: r.cfg.BaseModel}
	cands, at, err := r.activeAdapters(ctx, in.Environment, in.AgentVersion)
	if err != nil {
		d.Reason, d.Error = ReasonRegistryError, err.Error()
		r.log.Warn("router: adapter registry unavailable; routing to the base model", "environment", in.Environment, "err", err)
		return d
	}
	d.active = r.activeListOf(in.Environment, in.AgentVersion)
	r.observe(d.active, cands, at, r.cfg.Now())
	if len(cands) == 0 {
		d.Reason = ReasonNoAdapters
		return d
	}
	d.labels = r.labelsOf(d.active, cands, in.Environment)
	labels := d.labels.labels
	d.Labels = labels
	turns := CapContext(SelectContext(in.Turns, r.cfg.Context, r.cfg.LastN), r.cfg.ContextMaxChars)
	if len(turns) == 0 {
		d.Reason = ReasonNoMessages
		return d
	}
	if r.cls == nil {
		d.Reason, d.Error = ReasonClassifierError, "no classifier configured"
		return d
	}
	var examples map[string]Example
	if r.cfg.Retriever != nil {
		var caps []string
		for _, l := range labels {
			if !l.NoAdapter {
				caps = append(caps, l.Candidate.Capability)
			}
		}
		examples = r.cfg.Retriever.Examples(ctx, in.Environment, caps, turns)
		for c, e := range examples {
			if d.Examples == nil {
				d.Examples = map[string]string{}
			}
			d.Examples[c] = e.RolloutID
		}
	}
	msgs, err := r.messages(in.Environment, labels, turns, examples)
	if err != nil {
		d.Reason, d.Error = ReasonClassifierError, err.Error()
		return d
	}
	names := LabelNames(labels)
	req := llm.Request{Purpose: "route", RolloutID: in.ConversationID, Messages: msgs,
		Temperature: llm.Float(0), MaxTokens: 1, Logprobs: true, TopLogprobs: r.cfg.TopLogprobs, MaxAttempts: r.cfg.ClassifierAttempts}
	req.Extra = r.cfg.ClassifierExtraBody
	if r.cfg.LabelConstraint == ConstraintStructuredOutputs {
		req.Extra = maps.Clone(r.cfg.ClassifierExtraBody)
		if req.Extra == nil {
			req.Extra = map[string]any{}
		}
		req.Extra["structured_outputs"] = map[string]any{"choice": names}
	}
	d.ClassifierModel = r.cls.Model()
	start := time.Now()
	resp, err := r.cls.Chat(ctx, req)
	d.ClassifyLatency = time.Since(start)
	if err != nil {
		d.Reason, d.Error = ReasonClassifierError, err.Error()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			d.Error = fmt.Sprintf("no classification within the decision timeout (%s): %v", r.cfg.DecisionTimeout, err)
		}
		r.log.Warn("router: classifier failed; routing to the base model", "environment", in.Environment, "err", err)
		return d
	}
	probs, reason := Probabilities(resp.Logprobs, names, r.cfg.Temperature)
	d.Reason = reason
	if probs == nil {
		if reason == ReasonNoLabel {
			d.Error = fmt.Sprintf("answer %q and its alternatives hold none of the labels %s", cutText(resp.Raw, 40), strings.Join(names, ", "))
		}
		return d
	}
	d.Probabilities = probs
	ch := Decide(labels, probs, r.cfg.TopP)
	d.Label, d.Adapter, d.Capability, d.Weights = ch.Label, ch.Adapter, ch.Capability, ch.Weights
	if ch.Adapter != "" {
		d.Model = ch.Adapter
	}
	return d
}

type promptCandidate struct {
	Label, Capability, Description string
	// Example is the retrieved successful trajectory ("" without retrieval).
	Example string
}

func (r *Router) messages(env string, labels []Label, turns []Turn, examples map[string]Example) ([]llm.Message, error) {
	data := struct {
		Environment    string
		Candidates     []promptCandidate
		NoAdapterLabel string
		LabelList      string
		Turns          []Turn
	}{Environment: env, Turns: turns, LabelList: strings.Join(LabelNames(labels), ", ")}
	for _, l := range labels {
		if l.NoAdapter {
			data.NoAdapterLabel = l.Name
			continue
		}
		desc := strings.TrimSpace(l.Candidate.Description)
		if desc == "" {
			desc = strings.ReplaceAll(l.Candidate.Capability, "_", " ")
		}
		data.Candidates = append(data.Candidates, promptCandidate{Label: l.Name, Capability: l.Candidate.Capability, Description: desc,
			Example: examples[l.Candidate.Capability].Text})
	}
	var sys, user strings.Builder
	if err := r.tmpl.ExecuteTemplate(&sys, "system", data); err != nil {
		return nil, fmt.Errorf("prompt %s: %w", prompts.Route, err)
	}
	if err := r.tmpl.ExecuteTemplate(&user, "user", data); err != nil {
		return nil, fmt.Errorf("prompt %s: %w", prompts.Route, err)
	}
	return []llm.Message{{Role: "system", Content: strings.TrimSpace(sys.String())}, {Role: "user", Content: strings.TrimSpace(user.String())}}, nil
}

// NewID returns a random 128-bit hex id (decision and request ids).
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func cutText(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
