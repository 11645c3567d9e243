package ingest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/traceops/trace/schemas"
)

// ErrNotTau2 is returned when the input is a JSON object without a
// "simulations" array, i.e. not a τ²-bench result file.
var ErrNotTau2 = errors.New("not a τ²-bench result file (no \"simulations\" array)")

// Tau2Options tune ConvertTau2With and EachTau2.
type Tau2Options struct {
	// Source names the input (usually its path). Its base name is recorded
	// in the metadata as "source_file". Empty means unknown.
	Source string
}

// ConvertTau2 converts one τ²-bench result file (shared/data/README.md §2)
// into rollouts, one per simulation, in file order, and returns them all
// (EachTau2 hands them over one at a time instead; Replay streams).
//
// The mapping:
//
//   - environment = "tau2-" + info.environment_info.domain_name.
//   - agent.name = info.agent_info.llm (info.agent_info.implementation when
//     llm is empty). agent.version = Tau2AgentVersion(agent_info):
//     "<implementation>@<llm>", plus "#<8 hex>" — the first 4 bytes of the
//     SHA-256 of the canonical JSON of llm_args — when llm_args is not empty.
//     The same agent configuration therefore always lands in the same cohort,
//     and a change of sampling arguments starts a new one, without copying
//     llm_args (which may hold API keys) anywhere.
//   - rollout_id = simulation.id, task_id = simulation.task_id.
//   - start_time / end_time: the simulation's naive timestamps
//     ("2025-12-02T14:04:02.726730") read as UTC; an unparsable time is left
//     out.
//   - outcome.reward = reward_info.reward (0 when reward_info is missing, with
//     metadata "reward_missing": true); outcome.success is not set, so
//     success means reward == 1.0.
//   - grader.breakdown = reward_info.reward_breakdown; grader.reasons lists
//     the failed checks (db_check, action_checks, communicate_checks,
//     nl_assertions, env_assertions) as short strings. A failed check whose
//     category is not in reward_basis is suffixed " [not in reward basis]".
//   - messages: a system message with info.environment_info.policy first (when
//     present), then every message in order. Assistant and user messages keep
//     content (null becomes "") and tool calls (id, name, arguments object,
//     requestor — including the user-side calls of the telecom domain). Tool
//     messages become role "tool" with tool_call_id = the message's id,
//     content, error and requestor. turn_idx is kept, and so is a message's
//     "reasoning" text (some agents' files carry it). A message's "errors"
//     (a string, a list or an object, in some files) sets its error flag,
//     with the errors as error_text (list items joined with "; ").
//   - tools: info.environment_info.tool_defs mapped to OpenAI function schemas
//     (sorted by name). tool_defs is often null in result files; then the list
//     is derived from the distinct names of the agent-side tool calls seen
//     anywhere in the file, each with parameters {"type":"object"} and no
//     description, and metadata "tools_derived": true is set.
//   - metadata: source, source_file, tau2_domain, tau2_task_id, task_ref
//     ("<domain>:<task_id>", the id TRACE label runs use), trial, seed,
//     termination_reason, duration_s, agent_cost, user_cost, reward_basis,
//     agent_implementation, agent_llm, user_implementation, user_llm,
//     tau2_git_commit, run_seed, run_timestamp, user_tools (names of
//     user-side tools called), when present in the file.
//
// The rollouts are not validated here; marshal them and pass them to
// DecodeRollout (Replay does) to reject malformed simulations.
func ConvertTau2(r io.Reader) ([]*schemas.Rollout, error) {
	return ConvertTau2With(r, Tau2Options{})
}

// ConvertTau2With is ConvertTau2 with options.
func ConvertTau2With(r io.Reader, opt Tau2Options) ([]*schemas.Rollout, error) {
	var out []*schemas.Rollout
	err := EachTau2(r, opt, func(ro *schemas.Rollout) error {
		out = append(out, ro)
		return nil
	})
	return out, err
}

// ConvertTau2File opens and converts one τ²-bench result file, recording its
// base name in the metadata.
func ConvertTau2File(path string) ([]*schemas.Rollout, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ConvertTau2With(f, Tau2Options{Source: path})
}

// EachTau2 converts a τ²-bench result file like ConvertTau2 and calls fn for
// each rollout in file order. An error from fn, or a simulation that cannot be
// decoded (e.g. "messages" is not an array), stops the iteration and is
// returned. (Replay instead rejects such a simulation and goes on.)
//
// The file is read twice, one simulation at a time, so its size does not
// matter (see scanTau2): when r is an io.Seeker (a file) it is read again
// from where it was; any other reader is read whole into memory first.
func EachTau2(r io.Reader, opt Tau2Options, fn func(*schemas.Rollout) error) error {
	first, again, err := tau2Rewindable(r)
	if err != nil {
		return err
	}
	meta, err := scanTau2(context.Background(), first)
	if err != nil {
		return err
	}
	c := newTau2Converter(meta, opt)
	second, err := again()
	if err != nil {
		return err
	}
	_, err = tau2Walk(second, nil, func(first int, raw []jsontext.Value, _ []int64) error {
		for k, v := range raw {
			s, err := decodeTau2Simulation(first+k, v)
			if err != nil {
				return err
			}
			if err := fn(c.rollout(s)); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// tau2Rewindable returns r to read once, and a function returning it again
// from the same place: by seeking when r can seek, else from a copy in
// memory.
func tau2Rewindable(r io.Reader) (io.Reader, func() (io.Reader, error), error) {
	if s, ok := r.(io.ReadSeeker); ok {
		if pos, err := s.Seek(0, io.SeekCurrent); err == nil { // a pipe cannot seek
			return s, func() (io.Reader, error) {
				if _, err := s.Seek(pos, io.SeekStart); err != nil {
					return nil, err
				}
				return s, nil
			}, nil
		}
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, nil, err
	}
	return bytes.NewReader(data), func() (io.Reader, error) { return bytes.NewReader(data), nil }, nil
}

// Tau2AgentVersion returns the cohort version of a τ² agent:
// "<implementation>@<llm>" plus "#<8 hex of sha256(canonical llm_args)>" when
// llm_args is a non-empty value. Missing parts are dropped ("<llm>" alone when
// there is no implementation); the result is at most 128 bytes.
func Tau2AgentVersion(implementation, llm string, llmArgs any) string {
	var v string
	switch {
	case implementation != "" && llm != "":
		v = implementation + "@" + llm
	case llm != "":
		v = llm
	case implementation != "":
		v = implementation
	default:
		v = "unknown"
	}
	if !tau2EmptyJSON(llmArgs) {
		if b, err := json.Marshal(llmArgs); err == nil { // maps marshal with sorted keys
			sum := sha256.Sum256(b)
			v += "#" + hex.EncodeToString(sum[:4])
		}
	}
	if len(v) > 128 {
		sum := sha256.Sum256([]byte(v))
		v = tau2Truncate(v, 128-17) + "#" + hex.EncodeToString(sum[:8])
	}
	return v
}

// --- τ² file shape (only the parts the conversion reads) ---

// tau2Meta is what the conversion of any one simulation needs from the
// whole file: the top-level members other than "simulations" (wherever
// they are in the file: a writer may put "info" after the simulations) and
// the names of the tools called in every simulation (the derived tool list
// and user_tools). scanTau2 reads it in a first pass.
type tau2Meta struct {
	Timestamp any
	Info      tau2Info

	n                     int             // simulations
	agentNames, userNames map[string]bool // tools called by the agent, by the user, in the simulations that decode
}

type tau2Info struct {
	GitCommit       string      `json:"git_commit"`
	Seed            any         `json:"seed"`
	AgentInfo       tau2Actor   `json:"agent_info"`
	UserInfo        tau2Actor   `json:"user_info"`
	EnvironmentInfo tau2EnvInfo `json:"environment_info"`
}

type tau2Actor struct {
	Implementation string `json:"implementation"`
	LLM            string `json:"llm"`
	LLMArgs        any    `json:"llm_args"`
}

type tau2EnvInfo struct {
	DomainName string  `json:"domain_name"`
	Policy     *string `json:"policy"`
	ToolDefs   any     `json:"tool_defs"`
}

type tau2Simulation struct {
	ID                tau2LooseString `json:"id"`
	TaskID            tau2LooseString `json:"task_id"`
	Trial             any             `json:"trial"`
	Seed              any             `json:"seed"`
	StartTime         string          `json:"start_time"`
	EndTime           string          `json:"end_time"`
	Duration          any             `json:"duration"`
	TerminationReason any             `json:"termination_reason"`
	AgentCost         any             `json:"agent_cost"`
	UserCost          any             `json:"user_cost"`
	RewardInfo        *tau2RewardInfo `json:"reward_info"`
	Messages          []tau2Message   `json:"messages"`
}

type tau2RewardInfo struct {
	Reward          *float64            `json:"reward"`
	RewardBasis     []string            `json:"reward_basis"`
	RewardBreakdown map[string]*float64 `json:"reward_breakdown"`
	DBCheck         *struct {
		DBMatch *bool `json:"db_match"`
	} `json:"db_check"`
	ActionChecks []struct {
		Action struct {
			Name      string `json:"name"`
			Arguments any    `json:"arguments"`
			Requestor string `json:"requestor"`
		} `json:"action"`
		ActionMatch *bool `json:"action_match"`
	} `json:"action_checks"`
	CommunicateChecks []struct {
		Info any   `json:"info"`
		Met  *bool `json:"met"`
	} `json:"communicate_checks"`
	NLAssertions []struct {
		NLAssertion string `json:"nl_assertion"`
		Met         *bool  `json:"met"`
	} `json:"nl_assertions"`
	EnvAssertions []struct {
		EnvAssertion struct {
			FuncName string `json:"func_name"`
			Message  string `json:"message"`
		} `json:"env_assertion"`
		Met *bool `json:"met"`
	} `json:"env_assertions"`
}

type tau2Message struct {
	Role      string          `json:"role"`
	Content   any             `json:"content"`
	Reasoning any             `json:"reasoning"` // some agents' result files: the model's reasoning text
	ToolCalls []tau2ToolCall  `json:"tool_calls"`
	ID        tau2LooseString `json:"id"`
	Requestor string          `json:"requestor"`
	Error     *bool           `json:"error"`
	Errors    any             `json:"errors"` // some result files: what failed in this turn (a string, a list or an object)
	TurnIdx   *int            `json:"turn_idx"`
}

type tau2ToolCall struct {
	ID        tau2LooseString `json:"id"`
	Name      string          `json:"name"`
	Arguments any             `json:"arguments"`
	Requestor string          `json:"requestor"`
}

// tau2LooseString accepts a JSON string, number or null.
type tau2LooseString string

func (s *tau2LooseString) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*s = ""
	case len(b) > 0 && b[0] == '"':
		var v string
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		*s = tau2LooseString(v)
	default:
		var n json.Number
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("want a string or number, got %s", b)
		}
		*s = tau2LooseString(n.String())
	}
	return nil
}

// Simulations are read in batches of at most tau2BatchSims simulations or
// tau2BatchBytes bytes of their JSON (and one simulation, whatever its
// size), each converted on its own: memory holds one batch, not the file.
const (
	tau2BatchSims  = replayBatch
	tau2BatchBytes = 8 << 20
)

// tau2Walk reads a τ² result file with a streaming decoder (a UTF-8 byte
// order mark at its start is skipped; UTF-16 and compressed input are
// refused). meta (nil: skipped) is called with each top-level member
// other than "simulations", in file order; sims with each batch of
// simulations: the index (0-based) of its first, their JSON texts (owned
// by the callee), and the input offset after each (after the byte order
// mark). Member names are matched as encoding/json matches struct fields
// (case-insensitively). It returns the number of simulations; ErrNotTau2
// when the file has no (or a null) "simulations" member.
func tau2Walk(r io.Reader, meta func(name string, v jsontext.Value) error, sims func(first int, raw []jsontext.Value, ends []int64) error) (int, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	if _, err := replaySkipBOM(br); err != nil {
		return 0, err
	}
	// Duplicate names and invalid UTF-8 are left to encoding/json, which
	// decodes each value as it decoded the whole file before.
	dec := jsontext.NewDecoder(br, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	syntax := func(err error) error {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("τ² result file: %w", err)
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return 0, syntax(err)
	}
	if tok.Kind() != '{' {
		return 0, fmt.Errorf("τ² result file: not a JSON object (%s)", tok.Kind())
	}
	n, seen, array := 0, false, false
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return n, syntax(err)
		}
		name := tok.String()
		if !strings.EqualFold(name, "simulations") {
			if meta == nil {
				if err := replaySkipValue(dec); err != nil {
					return n, syntax(err)
				}
				continue
			}
			v, err := dec.ReadValue()
			if err != nil {
				return n, syntax(err)
			}
			if err := meta(name, v); err != nil {
				return n, err
			}
			continue
		}
		if seen {
			return n, errors.New(`τ² result file: "simulations" appears twice`)
		}
		seen = true
		switch dec.PeekKind() {
		case 'n':
			if _, err := dec.ReadToken(); err != nil {
				return n, syntax(err)
			}
			continue
		case '[':
			array = true
		default:
			if _, err := dec.ReadToken(); err != nil {
				return n, syntax(err)
			}
			return n, errors.New(`τ² result file: "simulations" is not an array`)
		}
		if _, err := dec.ReadToken(); err != nil {
			return n, syntax(err)
		}
		var raw []jsontext.Value
		var ends []int64
		size := 0
		flush := func() error {
			if len(raw) == 0 {
				return nil
			}
			err := sims(n-len(raw), raw, ends)
			raw, ends, size = nil, nil, 0
			return err
		}
		for dec.PeekKind() != ']' {
			v, err := dec.ReadValue()
			if err != nil {
				return n, syntax(err)
			}
			raw = append(raw, bytes.Clone(v)) // v is valid until the next read
			ends = append(ends, dec.InputOffset())
			size += len(v)
			n++
			if len(raw) >= tau2BatchSims || size >= tau2BatchBytes {
				if err := flush(); err != nil {
					return n, err
				}
			}
		}
		if err := flush(); err != nil {
			return n, err
		}
		if _, err := dec.ReadToken(); err != nil { // ]
			return n, syntax(err)
		}
	}
	if _, err := dec.ReadToken(); err != nil { // }
		return n, syntax(err)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			err = errors.New("trailing data after the JSON value")
		}
		return n, syntax(err)
	}
	if !array {
		return n, ErrNotTau2
	}
	return n, nil
}

// unmarshalNumber decodes exactly one JSON value, keeping numbers as
// json.Number.
func unmarshalNumber(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// scanTau2 is the first of the two passes over a τ² result file: it reads
// the top-level members other than "simulations" (the file's "info" may
// come after its simulations, and each rollout needs it) and the tool
// names of every simulation (each rollout lists the tools called anywhere
// in the file), decoding one batch of simulations at a time and keeping
// none. A simulation that does not decode is left to the second pass,
// which rejects it (and, as when the file was decoded whole, its tool
// calls are not counted). Errors are the file's as a whole: a syntax error
// anywhere, a top-level member of the wrong type, no "simulations".
// It stops when ctx ends.
func scanTau2(ctx context.Context, r io.Reader) (*tau2Meta, error) {
	m := &tau2Meta{agentNames: map[string]bool{}, userNames: map[string]bool{}}
	onMeta := func(name string, v jsontext.Value) error {
		var err error
		// As encoding/json decoded the file into a struct: names match
		// case-insensitively, and a repeated member is decoded again into
		// the same value.
		switch {
		case strings.EqualFold(name, "timestamp"):
			err = unmarshalNumber(v, &m.Timestamp)
		case strings.EqualFold(name, "info"):
			err = unmarshalNumber(v, &m.Info)
		}
		if err != nil {
			return fmt.Errorf("τ² result file: %s: %w", name, err)
		}
		return nil
	}
	type names struct{ agent, user []string }
	onSims := func(_ int, raw []jsontext.Value, _ []int64) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		found := make([]names, len(raw))
		replayParallel(len(raw), func(k int) {
			var s tau2Simulation
			if unmarshalNumber(raw[k], &s) != nil {
				return
			}
			for _, msg := range s.Messages {
				for _, tc := range msg.ToolCalls {
					switch {
					case tc.Name == "":
					case tc.Requestor == "user":
						found[k].user = append(found[k].user, tc.Name)
					default:
						found[k].agent = append(found[k].agent, tc.Name)
					}
				}
			}
		})
		for _, f := range found {
			for _, n := range f.agent {
				m.agentNames[n] = true
			}
			for _, n := range f.user {
				m.userNames[n] = true
			}
		}
		return nil
	}
	n, err := tau2Walk(r, onMeta, onSims)
	if err != nil {
		return nil, err
	}
	m.n = n
	return m, nil
}

// decodeTau2Simulation decodes the i-th (0-based) simulation of a file; its
// error names it (1-based).
func decodeTau2Simulation(i int, raw []byte) (*tau2Simulation, error) {
	var s tau2Simulation
	if err := unmarshalNumber(raw, &s); err != nil {
		return nil, fmt.Errorf("simulation %d: %w", i+1, err)
	}
	return &s, nil
}

// --- conversion ---

type tau2Converter struct {
	m            *tau2Meta
	opt          Tau2Options
	env          string
	agent        schemas.Agent
	tools        []schemas.Tool
	toolsDerived bool
	userTools    []string
}

func newTau2Converter(m *tau2Meta, opt Tau2Options) *tau2Converter {
	ai := m.Info.AgentInfo
	name := ai.LLM
	name = cmp.Or(name, ai.Implementation)
	name = cmp.Or(name, "unknown")
	c := &tau2Converter{
		m:     m,
		opt:   opt,
		env:   "tau2-" + tau2EnvSafe(m.Info.EnvironmentInfo.DomainName),
		agent: schemas.Agent{Name: tau2Truncate(name, 256), Version: Tau2AgentVersion(ai.Implementation, ai.LLM, ai.LLMArgs)},
	}
	c.tools = tau2ToolsFromDefs(m.Info.EnvironmentInfo.ToolDefs)
	c.userTools = tau2SortedKeys(m.userNames)
	if c.tools == nil {
		for _, n := range tau2SortedKeys(m.agentNames) {
			c.tools = append(c.tools, schemas.Tool{Type: "function", Function: schemas.FunctionDef{Name: n, Parameters: json.RawMessage(`{"type":"object"}`)}})
		}
		c.toolsDerived = true
	}
	return c
}

// rollout converts one simulation (read with decodeTau2Simulation). It
// may be called concurrently.
func (c *tau2Converter) rollout(s *tau2Simulation) *schemas.Rollout {
	info := &c.m.Info
	domain := info.EnvironmentInfo.DomainName
	ro := &schemas.Rollout{
		Schema:      "rollout/v1",
		RolloutID:   string(s.ID),
		Environment: c.env,
		Agent:       c.agent,
		TaskID:      string(s.TaskID),
		Tools:       c.tools,
		Metadata:    map[string]any{"source": "tau2-bench"},
	}
	if t, ok := parseTau2Time(s.StartTime); ok {
		ro.StartTime = t
	}
	if t, ok := parseTau2Time(s.EndTime); ok {
		ro.EndTime = t
	}

	// Outcome and grader.
	if ri := s.RewardInfo; ri != nil && ri.Reward != nil {
		ro.Outcome.Reward = *ri.Reward
	} else {
		ro.Metadata["reward_missing"] = true
	}
	if ri := s.RewardInfo; ri != nil {
		g := &schemas.Grader{Reasons: tau2Reasons(ri)}
		for k, v := range ri.RewardBreakdown {
			if v == nil {
				continue
			}
			if g.Breakdown == nil {
				g.Breakdown = make(map[string]float64, len(ri.RewardBreakdown))
			}
			g.Breakdown[k] = *v
		}
		if g.Reasons != nil || g.Breakdown != nil {
			ro.Grader = g
		}
		if len(ri.RewardBasis) > 0 {
			ro.Metadata["reward_basis"] = ri.RewardBasis
		}
	}

	// Messages.
	if p := info.EnvironmentInfo.Policy; p != nil && *p != "" {
		ro.Messages = append(ro.Messages, schemas.Message{Role: "system", Content: *p})
	}
	for _, m := range s.Messages {
		ro.Messages = append(ro.Messages, tau2ConvertMessage(m))
	}

	// Metadata.
	md := ro.Metadata
	tau2SetMeta(md, "source_file", tau2BaseName(c.opt.Source))
	tau2SetMeta(md, "tau2_domain", domain)
	tau2SetMeta(md, "tau2_task_id", string(s.TaskID))
	if domain != "" && s.TaskID != "" {
		md["task_ref"] = domain + ":" + string(s.TaskID)
	}
	tau2SetMeta(md, "trial", s.Trial)
	tau2SetMeta(md, "seed", s.Seed)
	tau2SetMeta(md, "termination_reason", s.TerminationReason)
	tau2SetMeta(md, "duration_s", s.Duration)
	tau2SetMeta(md, "agent_cost", s.AgentCost)
	tau2SetMeta(md, "user_cost", s.UserCost)
	tau2SetMeta(md, "agent_implementation", info.AgentInfo.Implementation)
	tau2SetMeta(md, "agent_llm", info.AgentInfo.LLM)
	tau2SetMeta(md, "user_implementation", info.UserInfo.Implementation)
	tau2SetMeta(md, "user_llm", info.UserInfo.LLM)
	tau2SetMeta(md, "tau2_git_commit", info.GitCommit)
	tau2SetMeta(md, "run_seed", info.Seed)
	tau2SetMeta(md, "run_timestamp", c.m.Timestamp)
	if c.toolsDerived {
		md["tools_derived"] = true
	}
	if len(c.userTools) > 0 {
		md["user_tools"] = c.userTools
	}
	return ro
}

func tau2ConvertMessage(m tau2Message) schemas.Message {
	out := schemas.Message{Role: m.Role, Content: tau2Content(m.Content), Reasoning: tau2Content(m.Reasoning), TurnIdx: m.TurnIdx}
	if m.Role == "tool" {
		out.ToolCallID = string(m.ID)
		out.Error = m.Error != nil && *m.Error
		out.Requestor = tau2Requestor(m.Requestor)
	}
	if text := tau2Errors(m.Errors); text != "" {
		out.Error, out.ErrorText = true, text
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, schemas.ToolCall{
			ID:        string(tc.ID),
			Name:      tc.Name,
			Arguments: tau2Arguments(tc.Arguments),
			Requestor: tau2Requestor(tc.Requestor),
		})
	}
	return out
}

// tau2Reasons lists the failed checks of a simulation as short strings.
func tau2Reasons(ri *tau2RewardInfo) []string {
	inBasis := func(cat string) bool {
		if len(ri.RewardBasis) == 0 {
			return true
		}
		for _, b := range ri.RewardBasis {
			if strings.EqualFold(b, cat) {
				return true
			}
		}
		return false
	}
	var out []string
	add := func(cat, s string) {
		s = tau2Truncate(s, 200)
		if !inBasis(cat) {
			s += " [not in reward basis]"
		}
		out = append(out, s)
	}
	if ri.DBCheck != nil && ri.DBCheck.DBMatch != nil && !*ri.DBCheck.DBMatch {
		add("DB", "db: final database state differs from the expected one")
	}
	for _, a := range ri.ActionChecks {
		if a.ActionMatch != nil && !*a.ActionMatch {
			args, _ := json.Marshal(a.Action.Arguments)
			who := ""
			if a.Action.Requestor == "user" {
				who = "user "
			}
			add("ACTION", fmt.Sprintf("action: expected %scall %s(%s) not made", who, a.Action.Name, tau2Truncate(string(args), 120)))
		}
	}
	for _, cc := range ri.CommunicateChecks {
		if cc.Met != nil && !*cc.Met {
			add("COMMUNICATE", fmt.Sprintf("communicate: %q not communicated", tau2Content(cc.Info)))
		}
	}
	for _, nl := range ri.NLAssertions {
		if nl.Met != nil && !*nl.Met {
			add("NL_ASSERTION", "nl_assertion not met: "+nl.NLAssertion)
		}
	}
	for _, ea := range ri.EnvAssertions {
		if ea.Met != nil && !*ea.Met {
			s := "env_assertion failed: " + ea.EnvAssertion.FuncName
			if ea.EnvAssertion.Message != "" {
				s += ": " + ea.EnvAssertion.Message
			}
			add("ENV_ASSERTION", s)
		}
	}
	return out
}

// tau2ToolsFromDefs maps tool_defs (τ²: {name: {name, doc, params, returns}}; a
// list of those, or of OpenAI tool schemas, is accepted too) to OpenAI
// function schemas sorted by name. It returns nil when there are none.
func tau2ToolsFromDefs(defs any) []schemas.Tool {
	var items []any
	switch d := defs.(type) {
	case map[string]any:
		for name, v := range d {
			if m, ok := v.(map[string]any); ok {
				if _, has := m["name"]; !has {
					m["name"] = name
				}
			}
			items = append(items, v)
		}
	case []any:
		items = d
	default:
		return nil
	}
	var out []schemas.Tool
	for _, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			continue
		}
		if fn, ok := m["function"].(map[string]any); ok { // already an OpenAI tool
			m = fn
		}
		name, _ := m["name"].(string)
		if name == "" {
			continue
		}
		desc, _ := m["description"].(string)
		if desc == "" {
			desc, _ = m["doc"].(string)
		}
		params, ok := m["parameters"].(map[string]any)
		if !ok {
			params, _ = m["params"].(map[string]any)
		}
		raw := json.RawMessage(`{"type":"object"}`)
		if params != nil {
			if b, err := json.Marshal(params); err == nil {
				raw = b
			}
		}
		out = append(out, schemas.Tool{Type: "function", Function: schemas.FunctionDef{Name: name, Description: desc, Parameters: raw}})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Function.Name < out[j].Function.Name })
	return out
}

// tau2Arguments turns tool-call arguments into a JSON object: an object is
// kept, null becomes {}, a string holding a JSON object is decoded, anything
// else is wrapped as {"_value": v}.
func tau2Arguments(v any) map[string]any {
	switch a := v.(type) {
	case map[string]any:
		return a
	case nil:
		return map[string]any{}
	case string:
		dec := json.NewDecoder(strings.NewReader(a))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err == nil && m != nil && !dec.More() {
			return m
		}
	}
	return map[string]any{"_value": v}
}

func tau2Content(v any) string {
	switch c := v.(type) {
	case nil:
		return ""
	case string:
		return c
	case json.Number:
		return c.String()
	default:
		b, err := json.Marshal(c)
		if err != nil {
			return fmt.Sprint(c)
		}
		return string(b)
	}
}

// tau2Errors renders a message's "errors" value as one text: a string as
// it is, the items of a list joined with "; " (strings as they are, other
// values as JSON), anything else as JSON; "" when there are none (null, "",
// [], {}).
func tau2Errors(v any) string {
	switch e := v.(type) {
	case nil:
		return ""
	case string:
		return e
	case []any:
		parts := make([]string, 0, len(e))
		for _, item := range e {
			if s := tau2Errors(item); s != "" {
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, "; ")
	case map[string]any:
		if len(e) == 0 {
			return ""
		}
	}
	return tau2Content(v)
}

func tau2Requestor(s string) string {
	if s == "assistant" || s == "user" {
		return s
	}
	return ""
}

var tau2TimeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05", // fractional seconds are accepted by Parse
	"2006-01-02 15:04:05",
	"2006-01-02 15:04:05Z07:00",
}

// parseTau2Time reads the naive ISO timestamps of τ² files as UTC.
func parseTau2Time(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, false
	}
	for _, l := range tau2TimeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}

// tau2EnvSafe makes a domain name fit the environment pattern
// ^[A-Za-z0-9][A-Za-z0-9_.:-]*$.
func tau2EnvSafe(domain string) string {
	if domain == "" {
		return "unknown"
	}
	b := []byte(domain)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-'
		if !ok {
			b[i] = '_'
		}
	}
	return tau2Truncate(string(b), 100)
}

func tau2EmptyJSON(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	case string:
		return x == ""
	}
	return false
}

func tau2SetMeta(md map[string]any, k string, v any) {
	if tau2EmptyJSON(v) {
		return
	}
	md[k] = v
}

func tau2BaseName(p string) string {
	if p == "" {
		return ""
	}
	return filepath.Base(p)
}

func tau2SortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// tau2Truncate cuts s to at most n bytes without splitting a rune, marking a
// cut with "…" (within the n bytes).
func tau2Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ell = "…"
	cut := n - len(ell)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if cut < 0 {
		cut = 0
	}
	return s[:cut] + ell
}
