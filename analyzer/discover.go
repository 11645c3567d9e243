package analyzer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/traceops/trace/internal/llm"
	"github.com/traceops/trace/prompts"
	"github.com/traceops/trace/schemas"
)

// Discovery is TRACE's analysis agent (TRACE-METHOD.md step 1.1): from a
// sample of one cohort's successful and failed rollouts an LLM proposes at
// most 10 general capabilities, which become a new dictionary version.

// ErrDiscoveryFailed is wrapped by Discover when no valid proposal was
// obtained (the client's attempts ran out or a request was refused).
var ErrDiscoveryFailed = errors.New("discovery failed")

// DefaultUnexplainedThreshold is the share of failures in a window with no
// LACKING label above which NeedsDiscovery asks for a new dictionary.
const DefaultUnexplainedThreshold = 0.5

// NeedsDiscovery is the trigger policy of discovery for one window: true
// when the cohort has no dictionary, or when more than threshold of the
// window's failed rollouts carry no LACKING label at all (the dictionary
// does not explain them). failuresWithoutLacking is clamped to
// [0, failuresInWindow]; a window without failures never needs a new
// version of an existing dictionary. Discover itself still refuses a sample
// without failures.
func NeedsDiscovery(hasDictionary bool, failuresInWindow, failuresWithoutLacking int, threshold float64) bool {
	if !hasDictionary {
		return true
	}
	if failuresInWindow <= 0 {
		return false
	}
	unexplained := min(max(failuresWithoutLacking, 0), failuresInWindow)
	return float64(unexplained)/float64(failuresInWindow) > threshold
}

// Defaults of DiscoverConfig.
const (
	DefaultDiscoverMaxRollouts        = 20
	DefaultDiscoverMaxTranscriptChars = 4000
	DefaultDiscoverMaxTokens          = 3000
)

// DiscoverConfig configures a Discoverer.
type DiscoverConfig struct {
	// Prompts resolves prompts/discover.md. Nil means the embedded prompts.
	Prompts *prompts.Set
	// MaxRollouts bounds the sample put in the prompt; a larger sample is
	// cut, alternating failures and successes in input order. Default 20.
	MaxRollouts int
	// MaxTranscriptChars bounds each rollout's conversation. Default 4000.
	MaxTranscriptChars int
	// MaxTokens of the answer. Default 3000.
	MaxTokens int
	// Now stamps CreatedAt. Default time.Now.
	Now func() time.Time
}

// Discoverer proposes capability dictionaries. Safe for concurrent use.
type Discoverer struct {
	client ChatClient
	cfg    DiscoverConfig
	tmpl   *template.Template
}

// NewDiscoverer parses the discovery prompt and returns a Discoverer.
func NewDiscoverer(client ChatClient, cfg DiscoverConfig) (*Discoverer, error) {
	if client == nil {
		return nil, errors.New("discoverer: client is nil")
	}
	cfg.MaxRollouts = cmp.Or(cfg.MaxRollouts, DefaultDiscoverMaxRollouts)
	cfg.MaxTranscriptChars = cmp.Or(cfg.MaxTranscriptChars, DefaultDiscoverMaxTranscriptChars)
	cfg.MaxTokens = cmp.Or(cfg.MaxTokens, DefaultDiscoverMaxTokens)
	if cfg.MaxRollouts < 2 || cfg.MaxTranscriptChars < 0 || cfg.MaxTokens < 0 {
		return nil, fmt.Errorf("discoverer: MaxRollouts must be >= 2 and the other limits >= 0 (got %d, %d, %d)", cfg.MaxRollouts, cfg.MaxTranscriptChars, cfg.MaxTokens)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Prompts == nil {
		cfg.Prompts = prompts.Default()
	}
	t, err := cfg.Prompts.Template(prompts.Discover)
	if err != nil {
		return nil, fmt.Errorf("discoverer: %w", err)
	}
	return &Discoverer{client: client, cfg: cfg, tmpl: t}, nil
}

// DiscoveryRequest is one discovery for one cohort.
type DiscoveryRequest struct {
	// Environment and AgentVersion scope the new dictionary; empty means
	// Previous's.
	Environment, AgentVersion string
	// Previous is the cohort's current dictionary, nil if none. The new one
	// gets Previous.Version+1 (or 1), and the prompt shows Previous.
	Previous *Dictionary
	// Rollouts is the sample: successes and failures of the cohort, with
	// distinct ids and at least one failure.
	Rollouts []*schemas.Rollout
}

// DiscoverPromptData is what prompts/discover.md is rendered with (strings
// from rollouts and dictionaries escaped as in LabelPromptData).
type DiscoverPromptData struct {
	Environment, AgentVersion string
	MaxCapabilities           int
	Failed, Succeeded         int
	Previous                  *DiscoverPromptDictionary // nil without a previous dictionary
	Rollouts                  []PromptRollout
	Families                  []PromptFamily // the template families a capability may name
}

// PromptFamily is one template family as the discovery prompt lists it.
type PromptFamily struct{ Name, Summary string }

// DiscoverPromptDictionary is the previous dictionary as shown to the model.
type DiscoverPromptDictionary struct {
	Version      uint32
	Capabilities []PromptCapability
}

// Discover asks the model for a dictionary and returns it validated, with
// Version = previous+1 and Source "discovery". Proposals that break a rule —
// more than 10 capabilities, a name that is not snake_case of 2–5 words or
// repeats, a definition that is not 2–3 sentences, fewer than 2 or more than
// 4 examples, an example id not in the sample — are rejected and the
// request retried; when the attempts run out the error wraps
// ErrDiscoveryFailed and no dictionary is returned.
func (g *Discoverer) Discover(ctx context.Context, req DiscoveryRequest) (*Dictionary, error) {
	env, agent, version := req.Environment, req.AgentVersion, uint32(1)
	if req.Previous != nil {
		env = cmp.Or(env, req.Previous.Environment)
		agent = cmp.Or(agent, req.Previous.AgentVersion)
		version = req.Previous.Version + 1
	}
	if env == "" || agent == "" {
		return nil, errors.New("discover: environment and agent version are required")
	}
	sample, err := g.sample(req.Rollouts)
	if err != nil {
		return nil, fmt.Errorf("discover %s/%s: %w", env, agent, err)
	}
	ids := make([]string, len(sample))
	for i, r := range sample {
		ids[i] = r.RolloutID
	}
	msgs, err := g.Prompt(env, agent, req.Previous, sample)
	if err != nil {
		return nil, err
	}
	resp, err := g.client.Chat(ctx, llm.Request{
		Purpose: PurposeDiscover, Messages: msgs,
		Schema: DiscoverySchema(ids), SchemaName: "trace_capabilities", MaxTokens: g.cfg.MaxTokens,
		Validate: func(content string) error {
			_, err := ParseDiscoveryAnswer(content, ids, env, agent, version)
			return err
		},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("discover %s/%s v%d: %w: %w", env, agent, version, ErrDiscoveryFailed, err)
	}
	d, err := ParseDiscoveryAnswer(resp.Content, ids, env, agent, version)
	if err != nil { // a client that does not run Validate
		return nil, fmt.Errorf("discover %s/%s v%d: %w: %w", env, agent, version, ErrDiscoveryFailed, err)
	}
	d.CreatedAt = g.cfg.Now().UTC().Truncate(time.Second)
	return d, nil
}

// sample checks the rollouts and cuts them to MaxRollouts, alternating
// failures and successes so both stay represented.
func (g *Discoverer) sample(rs []*schemas.Rollout) ([]*schemas.Rollout, error) {
	seen := map[string]bool{}
	var failed, passed []*schemas.Rollout
	for i, r := range rs {
		if r == nil || r.RolloutID == "" {
			return nil, fmt.Errorf("rollout %d has no id", i)
		}
		if seen[r.RolloutID] {
			return nil, fmt.Errorf("rollout id %q appears twice in the sample", r.RolloutID)
		}
		seen[r.RolloutID] = true
		if r.Succeeded() {
			passed = append(passed, r)
		} else {
			failed = append(failed, r)
		}
	}
	if len(failed) == 0 {
		return nil, errors.New("the sample has no failed rollout: nothing to explain")
	}
	if len(rs) <= g.cfg.MaxRollouts {
		return rs, nil
	}
	var out []*schemas.Rollout
	for i := 0; len(out) < g.cfg.MaxRollouts; i++ {
		if i < len(failed) {
			out = append(out, failed[i])
		}
		if i < len(passed) && len(out) < g.cfg.MaxRollouts {
			out = append(out, passed[i])
		}
	}
	return out, nil
}

// Prompt renders the discovery prompt: a single user message.
func (g *Discoverer) Prompt(env, agentVersion string, prev *Dictionary, sample []*schemas.Rollout) ([]llm.Message, error) {
	data := DiscoverPromptData{Environment: escapeData(env), AgentVersion: escapeData(agentVersion), MaxCapabilities: MaxCapabilities}
	for _, f := range TemplateFamilies {
		data.Families = append(data.Families, PromptFamily{Name: f, Summary: FamilySummaries[f]})
	}
	if prev != nil {
		data.Previous = &DiscoverPromptDictionary{Version: prev.Version, Capabilities: promptCapabilities(prev.Capabilities)}
	}
	for _, r := range sample {
		if r.Succeeded() {
			data.Succeeded++
		} else {
			data.Failed++
		}
		data.Rollouts = append(data.Rollouts, promptRollout(r, g.cfg.MaxTranscriptChars))
	}
	var b bytes.Buffer
	if err := g.tmpl.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("discoverer: rendering %s: %w", prompts.Discover, err)
	}
	return []llm.Message{{Role: "user", Content: b.String()}}, nil
}

// DiscoverySchema is the JSON Schema of a discovery answer for a sample
// with the given rollout ids:
//
//	{"capabilities": [{"name": "snake_case_name", "definition": "…", "examples": ["<id>", …], "family": "…"}]}
//
// 1–10 capabilities, names matching the dictionary's snake_case rule, 2–4
// examples drawn from ids, and the template family (one of TemplateFamilies
// or "other") the synthesizer builds its environment from.
func DiscoverySchema(ids []string) json.RawMessage {
	item := orderedObject{
		{"type", "object"},
		{"additionalProperties", false},
		{"required", []string{"name", "definition", "examples", "family"}},
		{"properties", orderedObject{
			{"name", orderedObject{{"type", "string"}, {"pattern", capNameRe.String()}}},
			{"definition", orderedObject{{"type", "string"}}},
			{"examples", orderedObject{
				{"type", "array"}, {"minItems", 2}, {"maxItems", 4},
				{"items", orderedObject{{"type", "string"}, {"enum", ids}}},
			}},
			{"family", orderedObject{{"type", "string"}, {"enum", append(slices.Clone(TemplateFamilies), FamilyOther)}}},
		}},
	}
	s := orderedObject{
		{"type", "object"},
		{"additionalProperties", false},
		{"required", []string{"capabilities"}},
		{"properties", orderedObject{{"capabilities", orderedObject{
			{"type", "array"}, {"minItems", 1}, {"maxItems", MaxCapabilities}, {"items", item},
		}}}},
	}
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return b
}

// ParseDiscoveryAnswer validates a discovery answer and returns the
// dictionary it proposes (Source "discovery", CreatedAt unset). ids are the
// rollout ids of the sample. Nothing is repaired; errors wrap llm.ErrSchema
// or llm.ErrInvalidJSON and list every problem found.
func ParseDiscoveryAnswer(content string, ids []string, env, agentVersion string, version uint32) (*Dictionary, error) {
	data := []byte(content)
	if !json.Valid(data) {
		return nil, fmt.Errorf("%w: the answer is not one JSON object", llm.ErrInvalidJSON)
	}
	if err := llm.CheckDuplicateKeys(data); err != nil {
		return nil, fmt.Errorf("%w: %v", llm.ErrSchema, err)
	}
	var ans struct {
		Capabilities []struct {
			Name       string   `json:"name"`
			Definition string   `json:"definition"`
			Examples   []string `json:"examples"`
			Family     string   `json:"family"` // optional here: the schema asks for it, an answer without it is still a dictionary
		} `json:"capabilities"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ans); err != nil {
		return nil, fmt.Errorf("%w: %v", llm.ErrSchema, err)
	}
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
	}
	var problems []string
	if n := len(ans.Capabilities); n == 0 || n > MaxCapabilities {
		problems = append(problems, fmt.Sprintf("%d capabilities proposed, want 1 to %d", n, MaxCapabilities))
	}
	d := &Dictionary{Environment: env, AgentVersion: agentVersion, Version: version, Source: "discovery"}
	names := map[string]bool{}
	for i, c := range ans.Capabilities {
		if !capNameRe.MatchString(c.Name) {
			problems = append(problems, fmt.Sprintf("capabilities[%d].name %q is not snake_case of 2-5 words", i, c.Name))
		} else if names[c.Name] {
			problems = append(problems, fmt.Sprintf("capabilities[%d].name %q appears twice", i, c.Name))
		}
		names[c.Name] = true
		def := strings.TrimSpace(c.Definition)
		if n := countSentences(def); n < 2 || n > 3 {
			problems = append(problems, fmt.Sprintf("%s: definition has %d sentences, want 2 to 3", c.Name, n))
		}
		if n := len(c.Examples); n < 2 || n > 4 {
			problems = append(problems, fmt.Sprintf("%s: %d examples, want 2 to 4", c.Name, n))
		}
		seen := map[string]bool{}
		for _, ex := range c.Examples {
			switch {
			case !known[ex]:
				problems = append(problems, fmt.Sprintf("%s: example %q is not a rollout id of the sample", c.Name, ex))
			case seen[ex]:
				problems = append(problems, fmt.Sprintf("%s: example %q appears twice", c.Name, ex))
			}
			seen[ex] = true
		}
		if !ValidFamily(c.Family) {
			problems = append(problems, fmt.Sprintf("%s: family %q is not one of %s or %q", c.Name, c.Family, strings.Join(TemplateFamilies, ", "), FamilyOther))
		}
		d.Capabilities = append(d.Capabilities, Capability{Name: c.Name, Definition: def, Examples: slices.Clone(c.Examples), Family: c.Family})
	}
	if len(problems) == 0 {
		if err := d.Validate(); err != nil { // the dictionary's own rules (definition length, …)
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		if len(problems) > 6 {
			problems = append(problems[:6], fmt.Sprintf("and %d more", len(problems)-6))
		}
		return nil, fmt.Errorf("%w: %s", llm.ErrSchema, strings.Join(problems, "; "))
	}
	return d, nil
}

// countSentences counts sentences ended by ".", "!" or "?" followed by white
// space or the end, plus a trailing unterminated one. Common abbreviations
// (e.g., i.e., etc., vs.) do not end a sentence.
func countSentences(s string) int {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0
	}
	for _, abbr := range []string{"e.g.", "i.e.", "etc.", "vs.", "cf.", "E.g.", "I.e."} {
		s = strings.ReplaceAll(s, abbr, "abbr")
	}
	n, open := 0, false
	rs := []rune(s)
	for i, r := range rs {
		if r == '.' || r == '!' || r == '?' {
			if open && (i == len(rs)-1 || rs[i+1] == ' ' || rs[i+1] == '\n' || rs[i+1] == '\t') {
				n++
				open = false
			}
			continue
		}
		if r != ' ' && r != '\n' && r != '\t' {
			open = true
		}
	}
	if open {
		n++
	}
	return n
}
