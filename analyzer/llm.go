package analyzer

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"unicode/utf8"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/prompts"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// Purposes of LLM calls, as recorded in the llm_calls audit table.
const (
	PurposeLabel    = "label"
	PurposeDiscover = "discover"
)

// ChatClient is the part of *llm.Client the LLM agents use. Chat must be safe
// for concurrent use; it retries internally and returns an error only when
// no attempt produced an answer that req.Schema and req.Validate accept.
type ChatClient interface {
	Chat(ctx context.Context, req llm.Request) (llm.Response, error)
}

// DefaultLLMRuns is TRACE's N: independent labeling runs per rollout.
const DefaultLLMRuns = 10

// DefaultMaxTranscriptChars bounds the conversation part of a prompt (about
// 6k tokens). Longer conversations keep their beginning and end; the middle
// messages are replaced by a line saying how many were left out.
const DefaultMaxTranscriptChars = 24000

// Floors of the prompt's budgets for a rollout's grader reasons and tool
// names (a quarter and an eighth of the transcript's otherwise).
const (
	minReasonsChars = 2000
	minToolsChars   = 1000
)

// MinTranscriptChars is the smallest MaxTranscriptChars: room for the task
// statement, the last messages and the line saying what was left out.
const MinTranscriptChars = 1000

// SampleRate is the probability that a rollout is labeled at all, per
// outcome.
//
// Why sampling per outcome keeps the statistics unbiased: every ratio TRACE
// computes has its numerator and its denominator within one outcome —
// ER− = L−/(L−+P−) and Cov = L−/|failed| count failed rollouts only, ER+ =
// L+/(L++P+) passed ones only, and Δ = ER− − ER+ is a difference of two such
// ratios. Sampling the failed rollouts at rate f scales L−, P−, N− and
// |failed| alike by f in expectation, so their ratios keep their expected
// value (they are ratio estimators: consistent, with a bias of order 1/n that
// vanishes as the window grows); the same holds for the passed rollouts at
// rate p. The decision is a hash of rollout_id, independent of the labels,
// so each outcome's sample is a uniform random subset of that outcome, and a
// redelivered rollout gets the same decision. What sampling changes is only
// the variance (fewer labeled rollouts) and quantities that mix outcomes,
// such as the share of LACKING labels over all rollouts — TRACE uses none.
// Typical use: label every failure (Failed 1) and a fraction of the far more
// numerous successes (Passed 0.3), cutting LLM cost without moving Cov or Δ.
//
// The zero SampleRate means the default {Failed: 1, Passed: 1}. To skip one
// outcome entirely set its rate to 0 and the other's above 0.
type SampleRate struct {
	Failed, Passed float64
}

// WithDefaults returns {1, 1} for the zero value, s otherwise.
func (s SampleRate) WithDefaults() SampleRate {
	if s == (SampleRate{}) {
		return SampleRate{Failed: 1, Passed: 1}
	}
	return s
}

// Validate checks both rates are in [0, 1].
func (s SampleRate) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"Failed", s.Failed}, {"Passed", s.Passed}} {
		if math.IsNaN(f.v) || f.v < 0 || f.v > 1 {
			return fmt.Errorf("sample rate %s must be in [0, 1], got %v", f.name, f.v)
		}
	}
	return nil
}

// ShouldLabel reports whether r is in the sample: a deterministic function of
// its rollout id and outcome (see SampleRate).
func (s SampleRate) ShouldLabel(r *schemas.Rollout) bool {
	s = s.WithDefaults()
	rate := s.Passed
	if !r.Succeeded() {
		rate = s.Failed
	}
	switch {
	case rate >= 1:
		return true
	case rate <= 0:
		return false
	}
	return sampleUnit(r.RolloutID) < rate
}

// sampleUnit maps a rollout id to a uniform number in [0, 1).
func sampleUnit(id string) float64 {
	h := sha256.Sum256([]byte("trace-sample/" + id))
	return float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53)
}

// AlreadyLabeledFunc returns the labeling runs already stored for (rollout,
// dictionary version) — for ClickHouse, the distinct run numbers of
// capability_labels and label_runs for the rollout's environment, agent
// version, rollout id and dictionary version (sink.StoredRuns; a backfill
// leaves out the runs recorded as failed, sink.DoneRuns). An error aborts Label (nothing is labeled, the
// caller retries the batch): calling the model without knowing would risk a
// second, different label for a run.
type AlreadyLabeledFunc func(ctx context.Context, r *schemas.Rollout, dictVersion uint32) (map[int]bool, error)

// LLMLabelerConfig configures an LLMLabeler.
type LLMLabelerConfig struct {
	// Runs is N, the independent runs per rollout, numbered 0..N-1.
	// Default 10.
	Runs int
	// SampleRate decides, per outcome, which rollouts are labeled at all.
	// Default {1, 1}: every rollout.
	SampleRate SampleRate
	// Prompts resolves prompts/label.md. Nil means the embedded prompts.
	Prompts *prompts.Set
	// AlreadyLabeled, when set, is consulted before any model call: runs it
	// reports are not labeled again. This is what keeps the statistics exact
	// under redelivery — the model would answer differently the second time,
	// and a second label for the same (rollout, capability, run) could land
	// in another bucket.
	AlreadyLabeled AlreadyLabeledFunc
	// MaxTokens per answer. Default 200 + 100 per capability.
	MaxTokens int
	// MaxTranscriptChars bounds the conversation in the prompt. Default
	// DefaultMaxTranscriptChars.
	MaxTranscriptChars int
}

// LLMLabeler labels rollouts with N independent LLM runs (Name "llm").
//
// Each run is a separate chat request carrying only the prompt (no shared
// conversation), so runs are independent samples at the client's
// temperature. All runs of a rollout are issued at once; the client's
// concurrency bound and rate limit pace them. A run whose answers never pass
// validation — every capability exactly once under its exact name, each
// with NA, PRESENT or LACKING — is returned Failed, with no label; a label
// never comes from anything but a valid answer.
type LLMLabeler struct {
	client ChatClient
	cfg    LLMLabelerConfig
	tmpl   *template.Template
}

// NewLLMLabeler validates cfg, parses the label prompt and returns a labeler.
func NewLLMLabeler(client ChatClient, cfg LLMLabelerConfig) (*LLMLabeler, error) {
	if client == nil {
		return nil, errors.New("llm labeler: client is nil")
	}
	cfg.Runs = cmp.Or(cfg.Runs, DefaultLLMRuns)
	if cfg.Runs < 1 || cfg.Runs > 1000 {
		return nil, fmt.Errorf("llm labeler: Runs must be in [1, 1000], got %d", cfg.Runs)
	}
	cfg.SampleRate = cfg.SampleRate.WithDefaults()
	if err := cfg.SampleRate.Validate(); err != nil {
		return nil, fmt.Errorf("llm labeler: %w", err)
	}
	if cfg.MaxTokens < 0 {
		return nil, fmt.Errorf("llm labeler: MaxTokens must be >= 0, got %d", cfg.MaxTokens)
	}
	cfg.MaxTranscriptChars = cmp.Or(cfg.MaxTranscriptChars, DefaultMaxTranscriptChars)
	if cfg.MaxTranscriptChars < MinTranscriptChars {
		return nil, fmt.Errorf("llm labeler: MaxTranscriptChars must be at least %d, got %d", MinTranscriptChars, cfg.MaxTranscriptChars)
	}
	if cfg.Prompts == nil {
		cfg.Prompts = prompts.Default()
	}
	t, err := cfg.Prompts.Template(prompts.Label)
	if err != nil {
		return nil, fmt.Errorf("llm labeler: %w", err)
	}
	return &LLMLabeler{client: client, cfg: cfg, tmpl: t}, nil
}

// Name implements Labeler.
func (l *LLMLabeler) Name() string { return schemas.SourceLLM }

// Runs implements Labeler.
func (l *LLMLabeler) Runs() int { return l.cfg.Runs }

// Estimate is the cost of one labeling run of r: its prompt's tokens
// (about 4 characters a token) and the completion token cap.
func (l *LLMLabeler) Estimate(d *Dictionary, r *schemas.Rollout) (promptTokens, maxCompletion int, err error) {
	msgs, err := l.Prompt(d, r)
	if err != nil {
		return 0, 0, err
	}
	for _, m := range msgs {
		promptTokens += (len(m.Content) + 3) / 4
	}
	maxCompletion = l.cfg.MaxTokens
	if maxCompletion == 0 {
		maxCompletion = 200 + 100*len(d.Capabilities)
	}
	return promptTokens, maxCompletion, nil
}

// ShouldLabel reports whether r is in the labeler's sample.
func (l *LLMLabeler) ShouldLabel(r *schemas.Rollout) bool { return l.cfg.SampleRate.ShouldLabel(r) }

// ErrLLMUnavailable wraps Label's error when the endpoint can answer no
// request as configured (llm.Unavailable: a refused key, an unknown model,
// nothing listening): the runs it failed are not returned, so that they
// are not recorded as failed and are asked again once it answers.
var ErrLLMUnavailable = errors.New("the LLM endpoint is unavailable")

// ErrLabelingStopped wraps Label's error when the stop of its context
// (llm.WithRetryStop: the analyze stage is shutting down, or holds the
// batch because the endpoint was found unavailable) came before some
// runs' next attempt: those runs did not fail and are not returned, so
// that they are asked when the rollout is labeled again; the runs
// answered are returned with it.
var ErrLabelingStopped = errors.New("labeling stopped (a shutdown, or the batch held while the LLM endpoint is unavailable); the runs not asked are left for the batch's redelivery")

// Label implements Labeler. It returns one RunLabels per run labeled now, in
// run order: none when r is not in the sample, and none for the runs that
// AlreadyLabeled reports. Failed runs carry the client's error (which lists
// every attempt's outcome). A cancelled ctx returns ctx.Err(). When some
// run failed because the endpoint is unavailable (ErrLLMUnavailable), or
// was stopped by ctx's stop (ErrLabelingStopped), the other runs are
// returned with that error, those runs left out.
func (l *LLMLabeler) Label(ctx context.Context, d *Dictionary, r *schemas.Rollout) ([]RunLabels, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(d.Capabilities) == 0 {
		return nil, fmt.Errorf("llm labeler: dictionary %s/%s v%d has no capabilities", d.Environment, d.AgentVersion, d.Version)
	}
	if !l.ShouldLabel(r) {
		return nil, nil
	}
	var done map[int]bool
	if l.cfg.AlreadyLabeled != nil {
		var err error
		if done, err = l.cfg.AlreadyLabeled(ctx, r, d.Version); err != nil {
			return nil, fmt.Errorf("llm labeler: runs already stored for %s: %w", r.RolloutID, err)
		}
	}
	var todo []int
	for run := range l.cfg.Runs {
		if !done[run] {
			todo = append(todo, run)
		}
	}
	if len(todo) == 0 {
		return nil, nil
	}
	msgs, err := l.Prompt(d, r)
	if err != nil {
		return nil, err
	}
	schema := LabelSchema(d)
	maxTokens := l.cfg.MaxTokens
	maxTokens = cmp.Or(maxTokens, 200+100*len(d.Capabilities))
	validate := func(content string) error {
		_, err := ParseLabelAnswer(d, content)
		return err
	}
	out := make([]RunLabels, len(todo))
	errs := make([]error, len(todo))
	var wg sync.WaitGroup
	for i, run := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := l.client.Chat(ctx, llm.Request{
				Purpose: PurposeLabel, RolloutID: r.RolloutID, Run: run,
				Messages: slices.Clone(msgs), Schema: schema, SchemaName: "trace_labels",
				Validate: validate, MaxTokens: maxTokens,
			})
			if err != nil {
				out[i], errs[i] = RunLabels{Run: run, Failed: err.Error()}, err
				return
			}
			labels, err := ParseLabelAnswer(d, resp.Content)
			if err != nil { // a client that does not run Validate
				out[i] = RunLabels{Run: run, Failed: "invalid answer: " + err.Error()}
				return
			}
			out[i] = RunLabels{Run: run, Labels: labels}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var unavailable, stopped error
	kept := out[:0]
	for i, rl := range out {
		switch {
		case errs[i] != nil && llm.Unavailable(errs[i]):
			unavailable = cmp.Or(unavailable, errs[i])
			continue
		case errors.Is(errs[i], llm.ErrStopped): // not asked: not a failed run
			stopped = cmp.Or(stopped, errs[i])
			continue
		}
		kept = append(kept, rl)
	}
	if unavailable != nil {
		return kept, fmt.Errorf("%w: %w", ErrLLMUnavailable, unavailable)
	}
	if stopped != nil {
		return kept, fmt.Errorf("%w: %w", ErrLabelingStopped, stopped)
	}
	return out, nil
}

// LabelPromptData is what prompts/label.md is rendered with. Every string
// that comes from a rollout or a dictionary is escaped so that it cannot
// close the data blocks ("<" and ">" become "&lt;" and "&gt;").
type LabelPromptData struct {
	Environment, AgentVersion string
	DictionaryVersion         uint32
	Capabilities              []PromptCapability
	Rollout                   PromptRollout
	// Skeleton is the answer format with every capability name filled in.
	Skeleton string
}

// PromptCapability is one capability as shown to a model.
type PromptCapability struct{ Name, Definition string }

// PromptRollout is one rollout as shown to a model: compacted like the
// rollouts table (content cut to 300 characters, tool arguments to 200).
type PromptRollout struct {
	ID, TaskID    string
	Outcome       string // SUCCESS | FAILURE
	Reward        string
	GraderReasons []string // the first that fit (see promptRollout), then how many were left out
	Tools         string   // names of the tools the agent had, comma separated (bounded likewise)
	// Transcript is one line per message: "[i] role: content", tool calls
	// on indented "tool call: name {args}" lines.
	Transcript string
}

// Prompt renders the labeling prompt for (d, r): a single user message, the
// only message of every run's request.
func (l *LLMLabeler) Prompt(d *Dictionary, r *schemas.Rollout) ([]llm.Message, error) {
	data := LabelPromptData{
		Environment: escapeData(d.Environment), AgentVersion: escapeData(d.AgentVersion), DictionaryVersion: d.Version,
		Capabilities: promptCapabilities(d.Capabilities),
		Rollout:      promptRollout(r, l.cfg.MaxTranscriptChars),
		Skeleton:     labelSkeleton(d),
	}
	var b bytes.Buffer
	if err := l.tmpl.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("llm labeler: rendering %s: %w", prompts.Label, err)
	}
	return []llm.Message{{Role: "user", Content: b.String()}}, nil
}

func promptCapabilities(cs []Capability) []PromptCapability {
	out := make([]PromptCapability, len(cs))
	for i, c := range cs {
		out[i] = PromptCapability{Name: c.Name, Definition: escapeData(oneLine(c.Definition))}
	}
	return out
}

func promptRollout(r *schemas.Rollout, maxChars int) PromptRollout {
	p := PromptRollout{
		ID: escapeData(r.RolloutID), TaskID: escapeData(r.TaskID), Outcome: "FAILURE",
		Reward:     strconv.FormatFloat(r.Outcome.Reward, 'g', 4, 64),
		Transcript: transcript(sink.CompactMessages(r.Messages), maxChars),
	}
	if r.Succeeded() {
		p.Outcome = "SUCCESS"
	}
	// The grader's reasons and the tool names are bounded too, each within
	// a share of maxChars (and at least a floor that a usual rollout's fit
	// in whole): their number is not limited in a rollout, and a prompt
	// must stay within the model's context and its price.
	reasonsBudget, toolsBudget := max(maxChars/4, minReasonsChars), max(maxChars/8, minToolsChars)
	if r.Grader != nil {
		used := 0
		for i, reason := range r.Grader.Reasons {
			line := escapeData(oneLine(sink.Truncate(reason, sink.MaxContentChars)))
			if maxChars > 0 && used+len(line) > reasonsBudget {
				p.GraderReasons = append(p.GraderReasons, fmt.Sprintf("[… %d more grader reasons left out …]", len(r.Grader.Reasons)-i))
				break
			}
			used += len(line)
			p.GraderReasons = append(p.GraderReasons, line)
		}
	}
	var tools strings.Builder
	for i, t := range r.Tools {
		name := escapeData(t.Function.Name)
		if maxChars > 0 && tools.Len()+len(name)+2 > toolsBudget {
			fmt.Fprintf(&tools, "[… %d more tools left out …]", len(r.Tools)-i)
			break
		}
		tools.WriteString(name)
		if i < len(r.Tools)-1 {
			tools.WriteString(", ")
		}
	}
	p.Tools = tools.String()
	return p
}

// transcript renders compacted messages, one line each (plus one per tool
// call). When the text exceeds maxChars, messages from the middle are left
// out and replaced by one line that says how many.
func transcript(msgs []sink.CompactMessage, maxChars int) string {
	lines := make([]string, len(msgs))
	total := 0
	for i, m := range msgs {
		lines[i] = messageLine(i, m)
		if maxChars > 0 {
			// One message takes at most half the budget (its contents are
			// cut at compaction, but not the number of its tool calls).
			lines[i] = cutLine(lines[i], maxChars/2)
		}
		total += len(lines[i]) + 1
	}
	if maxChars <= 0 || total <= maxChars || len(lines) < 3 {
		return strings.Join(lines, "\n")
	}
	// Keep the first messages (task statement) and as many of the last
	// (where failures show) as fit, half the budget each way.
	head, size := 0, 0
	for head < len(lines) && size+len(lines[head])+1 <= maxChars/2 {
		size += len(lines[head]) + 1
		head++
	}
	head = max(head, 1)
	tail := len(lines)
	for tail > head && size+len(lines[tail-1])+1 <= maxChars-40 {
		size += len(lines[tail-1]) + 1
		tail--
	}
	out := append([]string{}, lines[:head]...)
	if n := tail - head; n > 0 {
		out = append(out, fmt.Sprintf("[… %d messages left out …]", n))
	}
	return strings.Join(append(out, lines[tail:]...), "\n")
}

// cutLine cuts l to at most n bytes (at a character boundary), saying how
// much it left out.
func cutLine(l string, n int) string {
	if len(l) <= n {
		return l
	}
	keep := max(n-48, 0)
	for keep > 0 && !utf8.RuneStart(l[keep]) {
		keep--
	}
	return l[:keep] + fmt.Sprintf(" [… %d characters left out …]", len(l)-keep)
}

func messageLine(i int, m sink.CompactMessage) string {
	var b strings.Builder
	role := m.Role
	switch {
	case m.Role == "tool" && m.Error:
		role = "tool result (error)"
	case m.Role == "tool":
		role = "tool result"
	}
	if m.Requestor != "" && m.Requestor != "assistant" {
		role += " (" + m.Requestor + " side)"
	}
	if m.Error && m.Role != "tool" {
		role += " (error)"
	}
	fmt.Fprintf(&b, "[%d] %s: %s", i, escapeData(role), escapeData(oneLine(m.Content)))
	// Reasoning and error texts are cut like contents (sink.CompactMessages).
	if m.Reasoning != "" {
		fmt.Fprintf(&b, "\n    reasoning: %s", escapeData(oneLine(m.Reasoning)))
	}
	if m.ErrorText != "" {
		fmt.Fprintf(&b, "\n    error: %s", escapeData(oneLine(m.ErrorText)))
	}
	for _, tc := range m.ToolCalls {
		by := ""
		if tc.Requestor != "" && tc.Requestor != "assistant" {
			by = " (by " + tc.Requestor + ")"
		}
		fmt.Fprintf(&b, "\n    tool call%s: %s %s", escapeData(by), escapeData(tc.Name), escapeData(oneLine(tc.Arguments)))
	}
	return b.String()
}

// escapeData keeps data from closing or opening a delimited block.
func escapeData(s string) string {
	return strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(s)
}

// oneLine keeps a value on its line: line breaks are written as \n, so a
// message cannot forge the start of another.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", `\n`, "\n", `\n`, "\r", `\n`).Replace(s)
}

// labelSkeleton is the answer format with the dictionary's names filled in.
func labelSkeleton(d *Dictionary) string {
	var b strings.Builder
	b.WriteString("{\"labels\": {\n")
	for i, c := range d.Capabilities {
		name, _ := json.Marshal(c.Name)
		fmt.Fprintf(&b, "  %s: {\"reason\": \"<one short sentence>\", \"label\": \"<NA|PRESENT|LACKING>\"}", name)
		if i < len(d.Capabilities)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}}")
	return b.String()
}

// orderedObject marshals as a JSON object with its keys in slice order
// (structured-output decoders generate properties in schema order).
type orderedObject []kv

type kv struct {
	k string
	v any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, p := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(p.k)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(p.v)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// LabelSchema is the JSON Schema of a labeling answer for d:
//
//	{"labels": {"<capability>": {"reason": "<string>", "label": "NA"|"PRESENT"|"LACKING"}, …}}
//
// with one required property per capability, in dictionary order, and no
// other property anywhere. It satisfies OpenAI's strict mode and llama.cpp's
// grammar conversion, which then cannot emit a missing, extra or misspelled
// capability.
func LabelSchema(d *Dictionary) json.RawMessage {
	names := d.Names()
	entry := orderedObject{
		{"type", "object"},
		{"additionalProperties", false},
		{"required", []string{"reason", "label"}},
		{"properties", orderedObject{
			{"reason", orderedObject{{"type", "string"}}},
			{"label", orderedObject{{"type", "string"}, {"enum", []string{schemas.LabelNA, schemas.LabelPresent, schemas.LabelLacking}}}},
		}},
	}
	props := make(orderedObject, len(names))
	for i, n := range names {
		props[i] = kv{n, entry}
	}
	s := orderedObject{
		{"type", "object"},
		{"additionalProperties", false},
		{"required", []string{"labels"}},
		{"properties", orderedObject{{"labels", orderedObject{
			{"type", "object"},
			{"additionalProperties", false},
			{"required", names},
			{"properties", props},
		}}}},
	}
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // static shapes of strings and bools
	}
	return b
}

// ParseLabelAnswer validates a labeling answer against d and returns its
// labels (capability -> NA | PRESENT | LACKING). The answer must be the
// object LabelSchema describes: every capability of d exactly once under its
// exact name, no other capability, no repeated key, a label spelled exactly.
// Nothing is repaired. Errors wrap llm.ErrInvalidJSON or llm.ErrSchema.
func ParseLabelAnswer(d *Dictionary, content string) (map[string]string, error) {
	data := []byte(content)
	if !json.Valid(data) {
		return nil, fmt.Errorf("%w: the answer is not one JSON object", llm.ErrInvalidJSON)
	}
	if err := llm.CheckDuplicateKeys(data); err != nil {
		return nil, fmt.Errorf("%w: %v", llm.ErrSchema, err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("%w: the answer is not a JSON object", llm.ErrSchema)
	}
	raw, ok := top["labels"]
	if !ok || len(top) != 1 {
		return nil, fmt.Errorf("%w: want an object with the single key \"labels\", got keys %s", llm.ErrSchema, keyList(top))
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil || entries == nil {
		return nil, fmt.Errorf("%w: \"labels\" is not an object keyed by capability", llm.ErrSchema)
	}
	var problems []string
	for name := range entries {
		if _, ok := d.Lookup(name); !ok {
			problems = append(problems, fmt.Sprintf("unknown capability %q", name))
		}
	}
	slices.Sort(problems)
	labels := make(map[string]string, len(d.Capabilities))
	var missing []string
	for _, c := range d.Capabilities {
		e, ok := entries[c.Name]
		if !ok {
			missing = append(missing, c.Name)
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(e, &fields); err != nil || fields == nil {
			problems = append(problems, fmt.Sprintf("%s: not an object", c.Name))
			continue
		}
		var label string
		if err := json.Unmarshal(fields["label"], &label); err != nil {
			problems = append(problems, fmt.Sprintf("%s: \"label\" missing or not a string", c.Name))
			continue
		}
		if label != schemas.LabelNA && label != schemas.LabelPresent && label != schemas.LabelLacking {
			problems = append(problems, fmt.Sprintf("%s: label %q is not NA, PRESENT or LACKING", c.Name, label))
			continue
		}
		if r, ok := fields["reason"]; ok {
			var s string
			if json.Unmarshal(r, &s) != nil {
				problems = append(problems, fmt.Sprintf("%s: \"reason\" is not a string", c.Name))
				continue
			}
		}
		for k := range fields {
			if k != "label" && k != "reason" {
				problems = append(problems, fmt.Sprintf("%s: unexpected field %q", c.Name, k))
			}
		}
		labels[c.Name] = label
	}
	if len(missing) > 0 {
		problems = append(problems, "missing capabilities: "+strings.Join(missing, ", "))
	}
	if len(problems) > 0 {
		if len(problems) > 6 {
			problems = append(problems[:6], fmt.Sprintf("and %d more", len(problems)-6))
		}
		return nil, fmt.Errorf("%w: %s", llm.ErrSchema, strings.Join(problems, "; "))
	}
	return labels, nil
}

func keyList(m map[string]json.RawMessage) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, strconv.Quote(k))
	}
	slices.Sort(keys)
	return "[" + strings.Join(keys, ", ") + "]"
}
