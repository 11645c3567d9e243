package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/envprog"
	"github.com/traceops/trace/synthesizer/examples"
)

// envCmd is `trace env`. Other files of this package add subcommands to it
// in their init functions (it is a package-level variable, so it exists
// before any init runs).
var envCmd = &cobra.Command{
	Use:   "env",
	Short: "Environment programs (synthesized training environments): list, show, validate, play, calibrate, serve",
	Long: `An environment program is a verifiable training environment written in
Starlark against the contract of docs/environments.md: tools(), reset(seed),
step(state, call), reward(state, transcript), optional hint(state) and
reference(state), and a docstring on why it transfers to the target.

FILE is a path, or example:NAME for a program shipped with trace
(example:precondition_airline). Programs run sandboxed (a worker process
with bounded memory, steps and time) unless --in-process is given.`,
}

func init() {
	envCmd.AddCommand(newEnvValidateCmd(), newEnvPlayCmd())
	rootCmd.AddCommand(envCmd)
}

// envFlags are the flags shared by the env subcommands.
type envFlags struct {
	inProcess bool
	lim       envprog.Limits
}

func (f *envFlags) add(cmd *cobra.Command) {
	d := envprog.DefaultLimits
	cmd.Flags().BoolVar(&f.inProcess, "in-process", false, "run the program in this process (trusted programs only: memory is not bounded)")
	cmd.Flags().Uint64Var(&f.lim.MaxSteps, "max-steps", d.MaxSteps, "Starlark execution steps per contract call")
	cmd.Flags().Int64Var(&f.lim.MaxMemory, "max-memory", d.MaxMemory, "bytes of address space for a sandboxed program, above the worker's start-up size")
	cmd.Flags().DurationVar(&f.lim.CallTimeout, "call-timeout", d.CallTimeout, "wall-clock time per contract call")
	cmd.Flags().IntVar(&f.lim.MaxTurns, "max-turns", d.MaxTurns, "assistant turns per episode")
	cmd.Flags().Int64Var(&f.lim.ResetCache, "reset-cache", d.ResetCache, "bytes (estimated) of the per-seed reset cache: a seed's third and later resets copy its state instead of running reset; -1: none (validate never uses one)")
}

// check refuses limits that are the user's typo, naming the flag
// (envprog.Limits.Check).
func (f *envFlags) check() error {
	return f.lim.Check(func(key string) string { return "--" + strings.ReplaceAll(key, "_", "-") }, !f.inProcess)
}

// readProgram reads FILE, or a shipped example for example:NAME.
func readProgram(file string) (name string, src []byte, err error) {
	if ex, ok := strings.CutPrefix(file, "example:"); ok {
		if strings.TrimSuffix(ex, ".star") == strings.TrimSuffix(examples.PreconditionAirlineName, ".star") {
			return examples.PreconditionAirlineName, examples.PreconditionAirline, nil
		}
		return "", nil, fmt.Errorf("no example %q (the examples: %s)", ex, strings.TrimSuffix(examples.PreconditionAirlineName, ".star"))
	}
	src, err = os.ReadFile(file)
	if err != nil {
		return "", nil, err
	}
	return file, src, nil
}

func (f *envFlags) load(ctx context.Context, name string, src []byte) (envprog.Env, error) {
	if f.inProcess {
		return envprog.Load(ctx, name, src, f.lim)
	}
	return envprog.LoadSandboxed(ctx, name, src, f.lim)
}

// readTools reads target tool schemas: a JSON array of OpenAI tools, or an
// object with a "tools" array (a synthesis request or a rollout).
func readTools(file string) ([]schemas.Tool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var tools []schemas.Tool
	if err := json.Unmarshal(data, &tools); err != nil {
		var obj struct {
			Tools []schemas.Tool `json:"tools"`
		}
		if err2 := json.Unmarshal(data, &obj); err2 != nil || obj.Tools == nil {
			return nil, fmt.Errorf("--tools %s: want a JSON array of OpenAI tool schemas or an object with \"tools\": %v", file, err)
		}
		tools = obj.Tools
	}
	if len(tools) == 0 { // nothing to compare with: the check would be skipped
		return nil, fmt.Errorf("--tools %s: no tools in it (leave --tools out to skip the comparison with the target's tools)", file)
	}
	for i, t := range tools {
		if t.Function.Name == "" {
			return nil, fmt.Errorf("--tools %s: tool %d has no function.name", file, i)
		}
	}
	return tools, nil
}

func newEnvValidateCmd() *cobra.Command {
	var ef envFlags
	var toolsFile string
	var seeds int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Run every validation check on an environment program",
		Long: `Runs the checks a synthesized environment must pass before calibration
(docs/environments.md): it loads and every contract function has the right
shape; a 3–5 sentence docstring; its tools are target tools with identical
names, parameter names and types (with --tools); at most 5 tools; reset is
deterministic and at least 90% of the seeds give distinct instances; steps
are deterministic; random play (type-correct random calls) runs and its
rewards stay in [0, 1]; a do-nothing policy scores a mean below 0.2; the
reference solution scores 1.0 on every seed; hints are guidance, not
literal calls. Every check is printed with its verdict; the exit status is
1 when one fails.`,
		Example: `  trace env validate example:precondition_airline
  trace env validate my_env.star --tools airline_tools.json
  trace env validate my_env.star --tools synthesis_request.json --seeds 200 --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ef.check(); err != nil {
				return err
			}
			if seeds < 1 {
				return fmt.Errorf("--seeds %d: want at least 1", seeds)
			}
			name, src, err := readProgram(args[0])
			if err != nil {
				return err
			}
			var target []schemas.Tool
			if toolsFile != "" {
				if target, err = readTools(toolsFile); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			opts := envprog.ValidateOptions{Seeds: seeds, InProcess: ef.inProcess}
			if !asJSON {
				// A slow program takes minutes: say how far it got, as calibrate does.
				start, last, done := time.Now(), time.Now(), 0
				opts.OnCheck = func(c envprog.Check) {
					done++
					if time.Since(last) >= validateProgressEvery {
						fmt.Fprintf(cmd.ErrOrStderr(), "… %d/%d checks (%s: %s) in %s\n", done, envprog.NumChecks, c.Name, c.Verdict, time.Since(start).Round(time.Second))
						last = time.Now()
					}
				}
			}
			report, env, err := envprog.ValidateSource(ctx, name, src, target, ef.lim, opts)
			if env != nil {
				defer env.Close()
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				v := struct {
					Program *envprog.Info  `json:"program,omitempty"`
					OK      bool           `json:"ok"`
					Report  envprog.Report `json:"report"`
				}{OK: report.OK(), Report: report}
				if env != nil {
					info := env.Info()
					v.Program = &info
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(v); err != nil {
					return err
				}
			} else {
				if env != nil {
					printInfo(out, env.Info())
				}
				fmt.Fprint(out, report.String())
				var pass, fail, skip int
				for _, c := range report.Checks {
					switch c.Verdict {
					case envprog.Pass:
						pass++
					case envprog.Fail:
						fail++
					default:
						skip++
					}
				}
				fmt.Fprintf(out, "%d passed, %d failed, %d skipped\n", pass, fail, skip)
			}
			if !report.OK() {
				checks := "checks"
				if len(report.Failed()) == 1 {
					checks = "check"
				}
				return &exitError{code: 1, err: fmt.Errorf("%s failed validation: %d %s failed", name, len(report.Failed()), checks)}
			}
			return nil
		},
	}
	ef.add(cmd)
	cmd.Flags().StringVar(&toolsFile, "tools", "", "the target's tools: a JSON array of OpenAI tool schemas, or a synthesis request (its \"tools\")")
	cmd.Flags().IntVar(&seeds, "seeds", 100, "seeds 0..N-1 every check plays")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the program's info and the report as JSON")
	return cmd
}

// validateProgressEvery is how often trace env validate says how far it got.
var validateProgressEvery = 10 * time.Second

func printInfo(w io.Writer, info envprog.Info) {
	names := make([]string, len(info.Tools))
	for i, t := range info.Tools {
		names[i] = t.Function.Name
	}
	fmt.Fprintf(w, "%s  sha256:%s\n", info.Name, info.Hash[:16])
	fmt.Fprintf(w, "  tools: %s\n", strings.Join(names, ", "))
	fmt.Fprintf(w, "  hint(): %v  reference(): %v\n", yesNo(info.HasHint), yesNo(info.HasReference))
	if info.Doc != "" {
		fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(strings.TrimSpace(info.Doc), "\n", "\n  "))
	}
	fmt.Fprintln(w)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newEnvPlayCmd() *cobra.Command {
	var ef envFlags
	var seed int64
	var hint bool
	cmd := &cobra.Command{
		Use:   "play FILE --seed N",
		Short: "Play an environment program by hand",
		Long: `Starts the episode of seed N and shows its system prompt and user message.
You are the policy: each line you type is one assistant turn.

  {"name": "get_reservation_details", "arguments": {"reservation_id": "AB12CD"}}
                      a tool call (JSON; "arguments" may also be a JSON string)
  [{"name": ...}, {"name": ...}]
                      several tool calls in one turn
  any other text      the final answer: it ends the episode
  :hint               show the program's hint for this instance
  :reference          show the program's reference solution
  :quit               stop and score the episode as it stands
  Ctrl-C              stop at once, without scoring (exit 130)

Tool results are printed after each call; at the end the reward and its
components. Input may be piped (one turn per line).`,
		Example: `  trace env play example:precondition_airline --seed 3
  printf '%s\n' '{"name":"get_user_details","arguments":{"user_id":"mia_kim_123"}}' 'Done.' | trace env play my_env.star --seed 0`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ef.check(); err != nil {
				return err
			}
			if seed < 0 {
				// The instances trainers get: the environment server's
				// seeds are OpenEnv's, 0 to 2⁶³−1.
				return fmt.Errorf("--seed %d: a seed is 0 or more, as the environment server takes them", seed)
			}
			name, src, err := readProgram(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			env, err := ef.load(ctx, name, src)
			if err != nil {
				return err
			}
			defer env.Close()
			return play(ctx, env, seed, hint, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	ef.add(cmd)
	cmd.Flags().Int64Var(&seed, "seed", 0, "the episode's seed (0 or more)")
	cmd.Flags().BoolVar(&hint, "hint", false, "append the program's hint to the system prompt, as hinted rollouts see it")
	return cmd
}

// play runs one interactive episode. On a terminal it prompts; with piped
// input it echoes each turn, so the output reads as a transcript.
func play(ctx context.Context, env envprog.Env, seed int64, withHint bool, in io.Reader, out io.Writer) error {
	ep, err := env.Reset(ctx, seed)
	if err != nil {
		return err
	}
	defer ep.Close()
	interactive := false
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		interactive = true
	}
	info := env.Info()
	start := ep.Start()
	system := start.System
	if withHint && info.HasHint {
		h, err := ep.Hint(ctx)
		if err != nil {
			return err
		}
		system += "\n\n" + envprog.HintOpen + "\n" + h + "\n" + envprog.HintClose
	}
	names := make([]string, len(info.Tools))
	for i, t := range info.Tools {
		names[i] = t.Function.Name
	}
	fmt.Fprintf(out, "%s, seed %d. Tools: %s\n\n", info.Name, seed, strings.Join(names, ", "))
	if withHint && !info.HasHint {
		fmt.Fprintf(out, "(the program has no hint(): --hint adds nothing)\n\n")
	}
	fmt.Fprintf(out, "── system ──\n%s\n\n── user ──\n%s\n\n", system, start.User)
	if interactive {
		fmt.Fprintln(out, `Type a tool call as JSON ({"name": ..., "arguments": {...}}), or the final answer as plain text (:hint, :reference, :quit).`)
	}
	// Lines are read apart from the loop, so that Ctrl-C (ctx) stops play
	// while it waits for one.
	lines, readErr, stopReading := readLines(in)
	defer close(stopReading)
	turn := 0
	for {
		if interactive {
			fmt.Fprint(out, "> ")
		}
		var text string
		var ok bool
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\n(interrupted: the episode is not scored)")
			return &exitError{code: 130, err: fmt.Errorf("interrupted on seed %d", seed)}
		case text, ok = <-lines:
		}
		if !ok {
			if err := <-readErr; err != nil {
				return err
			}
			fmt.Fprintln(out, "\n(input ended: the episode is scored as it stands)")
			break
		}
		line := strings.TrimSpace(text)
		if line == "" {
			continue
		}
		if !interactive {
			fmt.Fprintf(out, "> %s\n", line)
		}
		switch line {
		case ":quit":
			return printReward(ctx, ep, out, "stopped: the episode is scored as it stands")
		case ":hint":
			h, err := ep.Hint(ctx)
			if err != nil {
				return err
			}
			if !info.HasHint {
				h = "(the program has no hint())"
			}
			fmt.Fprintf(out, "%s\n\n", h)
			continue
		case ":reference":
			ref, err := ep.Reference(ctx)
			if err != nil {
				return err
			}
			if !info.HasReference {
				fmt.Fprintln(out, "(the program has no reference())")
			}
			for _, a := range ref {
				fmt.Fprintf(out, "  %s\n", actionText(a))
			}
			fmt.Fprintln(out)
			continue
		}
		a, err := parseTurn(line)
		if err != nil {
			fmt.Fprintf(out, "not a tool call: %v (a final answer must not start with { or [)\n\n", err)
			continue
		}
		turn++
		res, err := ep.Step(ctx, a)
		if err != nil {
			var pe *envprog.ProgramError
			if errors.As(err, &pe) {
				fmt.Fprintf(out, "the program failed: %v\n", pe)
				return &exitError{code: 1, err: fmt.Errorf("the environment program failed on seed %d", seed)}
			}
			return err
		}
		for _, m := range res.ToolResults {
			fmt.Fprintf(out, "[%s] %s\n", m.Name, m.Content)
		}
		if len(res.ToolResults) > 0 {
			fmt.Fprintln(out)
		}
		if res.Done {
			if len(a.ToolCalls) > 0 {
				fmt.Fprintf(out, "(the episode ended after turn %d)\n", turn)
			}
			break
		}
	}
	return printReward(ctx, ep, out, "")
}

// readLines sends in's lines on lines until it ends or stop is closed;
// then lines is closed and readErr holds the read's error (nil at EOF).
func readLines(in io.Reader) (lines <-chan string, readErr <-chan error, stop chan<- struct{}) {
	ls, errc, st := make(chan string), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(ls)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case ls <- sc.Text():
			case <-st:
				return
			}
		}
		errc <- sc.Err()
	}()
	return ls, errc, st
}

// parseTurn reads one line: a tool call object, a list of them, or text.
func parseTurn(line string) (envprog.Action, error) {
	if !strings.HasPrefix(line, "{") && !strings.HasPrefix(line, "[") {
		return envprog.Action{Content: line}, nil
	}
	type call struct {
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	var calls []call
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if strings.HasPrefix(line, "{") {
		var c call
		if err := dec.Decode(&c); err != nil {
			return envprog.Action{}, err
		}
		calls = []call{c}
	} else if err := dec.Decode(&calls); err != nil {
		return envprog.Action{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		// Two objects on a line are not two calls: a turn of several is a list.
		return envprog.Action{}, errors.New(`text after the tool call (several calls in one turn are a list: [{"name": ...}, {"name": ...}])`)
	}
	var a envprog.Action
	for _, c := range calls {
		if c.Name == "" {
			return envprog.Action{}, errors.New(`a tool call needs "name"`)
		}
		a.ToolCalls = append(a.ToolCalls, envprog.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
	}
	if len(a.ToolCalls) == 0 {
		return envprog.Action{}, errors.New("an empty list of tool calls")
	}
	return a, nil
}

func actionText(a envprog.Action) string {
	if len(a.ToolCalls) == 0 {
		return "final: " + a.Content
	}
	parts := make([]string, len(a.ToolCalls))
	for i, tc := range a.ToolCalls {
		var args bytes.Buffer
		if json.Compact(&args, tc.Arguments) != nil {
			args.Write(tc.Arguments)
		}
		parts[i] = fmt.Sprintf(`{"name": %q, "arguments": %s}`, tc.Name, args.String())
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func printReward(ctx context.Context, ep envprog.Episode, out io.Writer, note string) error {
	if note != "" {
		fmt.Fprintf(out, "(%s)\n", note)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r, err := ep.Reward(ctx)
	var pe *envprog.ProgramError
	if err != nil && !errors.As(err, &pe) {
		return err // interrupted (ctx), or the sandbox's own failure: not the program's
	}
	if err != nil {
		fmt.Fprintf(out, "reward: the program failed: %v\n", err)
		return &exitError{code: 1, err: fmt.Errorf("reward failed on seed %d", ep.Seed())}
	}
	fmt.Fprintf(out, "reward %.4g", r.Value)
	if len(r.Components) > 0 {
		keys := make([]string, 0, len(r.Components))
		for k := range r.Components {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s=%.4g", k, r.Components[k])
		}
		fmt.Fprintf(out, "  (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintln(out)
	return nil
}
