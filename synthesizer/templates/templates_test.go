package templates

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/traceops/trace/internal/dev/simpolicy"
	"github.com/traceops/trace/internal/dev/simulate"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
)

func load(t *testing.T, tpl *Template) envprog.Env {
	t.Helper()
	env, err := envprog.Load(context.Background(), tpl.Name, tpl.Program, envprog.Limits{})
	if err != nil {
		t.Fatalf("%s: load: %v", tpl.Name, err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// Every family instantiates against both simulated targets and passes the
// runtime's validation against the target's own tools: tools a subset of
// the target's with identical schemas, deterministic and distinct
// instances, rewards in range on random play, a do-nothing policy scoring
// low, the reference scoring 1.0 on every seed, hints that are guidance.
func TestEveryFamilyValidatesOnSimulatedTargets(t *testing.T) {
	for _, target := range simulate.Environments {
		tools := simulate.Tools(target)
		for _, fam := range Names() {
			t.Run(target+"/"+fam, func(t *testing.T) {
				tpl, err := Instantiate(fam, tools, Knobs{})
				if err != nil {
					t.Fatal(err)
				}
				env := load(t, tpl)
				rep, err := envprog.Validate(context.Background(), env, tools, envprog.ValidateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if !rep.OK() {
					t.Fatalf("validation failed:\n%s", rep.Diagnosis())
				}
				for _, c := range rep.Checks {
					if c.Verdict == envprog.Skip {
						t.Errorf("check %s skipped: %s", c.Name, c.Msg)
					}
				}
				info := env.Info()
				byName := map[string]schemas.Tool{}
				for _, tl := range tools {
					byName[tl.Function.Name] = tl
				}
				for _, tl := range info.Tools {
					want, ok := byName[tl.Function.Name]
					a, _ := json.Marshal(tl)
					b, _ := json.Marshal(want)
					if !ok || string(a) != string(b) {
						t.Errorf("tool %s differs from the target's:\n got %s\nwant %s", tl.Function.Name, a, b)
					}
				}
				for role, name := range tpl.Tools {
					if _, ok := byName[name]; !ok {
						t.Errorf("role %s uses %s, not a target tool", role, name)
					}
				}
				if !strings.HasPrefix(info.Doc, tpl.Rationale) {
					t.Errorf("docstring does not start with the rationale:\n%s", info.Doc)
				}
			})
		}
	}
}

// The roles are filled with the target's own tools.
func TestRolesPickTargetTools(t *testing.T) {
	tests := []struct {
		target, family string
		want           map[string]string
	}{
		{simulate.Airline, PreconditionVerification, map[string]string{"read": "get_reservation_details", "write": "cancel_reservation"}},
		{simulate.Retail, PreconditionVerification, map[string]string{"read": "get_order_details", "write": "cancel_pending_order"}},
		{simulate.Airline, MultiStepCompletion, map[string]string{"read": "get_reservation_details", "write": "cancel_reservation", "write_2": "update_reservation_baggages"}},
		{simulate.Retail, MultiStepCompletion, map[string]string{"read": "get_order_details", "write": "cancel_pending_order", "write_2": "modify_pending_order_payment"}},
		{simulate.Retail, ArgumentGrounding, map[string]string{"user_read": "get_user_details", "read": "get_order_details", "write": "cancel_pending_order"}},
		{simulate.Airline, StructuredDataReasoning, map[string]string{"user_read": "get_user_details", "read": "get_reservation_details"}},
	}
	for _, tt := range tests {
		tpl, err := Instantiate(tt.family, simulate.Tools(tt.target), Knobs{})
		if err != nil {
			t.Fatalf("%s %s: %v", tt.target, tt.family, err)
		}
		if len(tpl.Tools) != len(tt.want) {
			t.Errorf("%s %s: roles %v, want %v", tt.target, tt.family, tpl.Tools, tt.want)
		}
		for role, name := range tt.want {
			if tpl.Tools[role] != name {
				t.Errorf("%s %s: role %s = %q, want %q", tt.target, tt.family, role, tpl.Tools[role], name)
			}
		}
	}
}

func mkTool(name, params string) schemas.Tool {
	return schemas.Tool{Type: "function", Function: schemas.FunctionDef{Name: name, Description: "The " + name + " tool.", Parameters: json.RawMessage(params)}}
}

// A target with other names, parameter names and types: the template
// adapts (booking_id records, an integer and an enum argument) and its
// reference still scores 1.0.
func TestAdaptsToAnotherTarget(t *testing.T) {
	tools := []schemas.Tool{
		mkTool("find_member", `{"type":"object","properties":{"user_id":{"type":"string"}},"required":["user_id"]}`),
		mkTool("get_booking", `{"type":"object","properties":{"booking_id":{"type":"string"}},"required":["booking_id"]}`),
		mkTool("change_booking_seats", `{"type":"object","properties":{"booking_id":{"type":"string"},"seats":{"type":"integer"},"class":{"type":"string","enum":["standard","premium"]}},"required":["booking_id","seats","class"]}`),
		mkTool("search_venues", `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`),
	}
	for _, fam := range Names() {
		tpl, err := Instantiate(fam, tools, Knobs{})
		if err != nil {
			t.Fatalf("%s: %v", fam, err)
		}
		env := load(t, tpl)
		rep, err := envprog.Validate(context.Background(), env, tools, envprog.ValidateOptions{Seeds: 30})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			t.Errorf("%s on a booking target:\n%s", fam, rep.Diagnosis())
		}
		if !strings.Contains(string(tpl.Program), `"key\":\"booking_id\"`) && !strings.Contains(string(tpl.Program), `\"key\":\"booking_id\"`) {
			t.Errorf("%s: the program does not use booking_id as its record key", fam)
		}
	}
}

// A target that lacks a role fails clearly, naming the role.
func TestMissingRoles(t *testing.T) {
	noWrite := []schemas.Tool{
		mkTool("get_user_details", `{"type":"object","properties":{"user_id":{"type":"string"}},"required":["user_id"]}`),
		mkTool("get_order_details", `{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}`),
	}
	noRead := []schemas.Tool{
		mkTool("cancel_pending_order", `{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}`),
		mkTool("calculate", `{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`),
	}
	arrayWrite := []schemas.Tool{
		mkTool("get_order_details", `{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}`),
		mkTool("return_delivered_order_items", `{"type":"object","properties":{"order_id":{"type":"string"},"item_ids":{"type":"array","items":{"type":"string"}}},"required":["order_id","item_ids"]}`),
	}
	tests := []struct {
		family string
		tools  []schemas.Tool
		role   string
	}{
		{PreconditionVerification, noWrite, RoleRecordWrite},
		{PreconditionVerification, noRead, RoleRecordRead},
		{PreconditionVerification, arrayWrite, RoleRecordWrite},
		{ArgumentGrounding, noRead, RoleUserRead},
		{MultiStepCompletion, noWrite, RoleRecordWrite},
		{ToolErrorRecovery, noRead, RoleRecordRead},
		{UserConfirmation, noWrite, RoleRecordWrite},
		{StructuredDataReasoning, noRead, RoleUserRead},
		{StructuredDataReasoning, noWrite[:1], RoleRecordRead},
	}
	for _, tt := range tests {
		_, err := Instantiate(tt.family, tt.tools, Knobs{})
		var re *RoleError
		if !errors.As(err, &re) || re.Role != tt.role || re.Family != tt.family {
			t.Errorf("%s: error %v, want a RoleError for %q", tt.family, err, tt.role)
			continue
		}
		if !strings.Contains(err.Error(), tt.role) || !strings.Contains(err.Error(), tt.tools[0].Function.Name) {
			t.Errorf("%s: error %q names neither the role nor the target's tools", tt.family, err)
		}
	}
	if _, err := Instantiate("time_travel", simulate.Tools(simulate.Airline), Knobs{}); err == nil || !strings.Contains(err.Error(), "unknown family") {
		t.Errorf("unknown family: %v", err)
	}
	if _, err := Instantiate(PreconditionVerification, simulate.Tools(simulate.Airline), Knobs{Steps: 0, Records: 2}); err == nil || !strings.Contains(err.Error(), "steps") {
		t.Errorf("bad knobs: %v", err)
	}
}

// The knobs change the instances: more steps, more required actions.
func TestKnobsChangeInstances(t *testing.T) {
	tools := simulate.Tools(simulate.Retail)
	count := func(steps int) int {
		k := Knobs{Records: steps + 1, Steps: steps, Distractors: 1, HintShareMin: 0.25, HintShareMax: 0.5}
		tpl, err := Instantiate(MultiStepCompletion, tools, k)
		if err != nil {
			t.Fatal(err)
		}
		env := load(t, tpl)
		ep, err := env.Reset(context.Background(), 3)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := ep.Reference(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(ref) - 1 // the writes, without the final answer
	}
	if a, b := count(2), count(5); a != 2 || b != 5 {
		t.Errorf("required writes with steps 2 and 5: %d and %d", a, b)
	}
}

// The planted deficits of the simulated fleet calibrate inside the
// default bands with the simulated policy (100 seeds × 16 rollouts).
func TestSimulatedPolicyCalibratesPlantedDeficits(t *testing.T) {
	fleet := simulate.DefaultFleet()
	tests := []struct{ target, version, capability string }{
		{simulate.Airline, "1.4.0", simulate.PreconditionVerification},
		{simulate.Airline, "1.4.0", simulate.MultiStepCompletion},
		{simulate.Retail, "1.5.0", simulate.ArgumentGrounding},
	}
	for _, tt := range tests {
		t.Run(tt.capability, func(t *testing.T) {
			pol, err := simpolicy.SimulatedFleetPolicy(fleet, tt.target, tt.version, tt.capability)
			if err != nil {
				t.Fatal(err)
			}
			fam, score, why := Match(tt.capability, "")
			if fam != tt.capability || score != 1 {
				t.Fatalf("Match(%s) = %s %v (%s)", tt.capability, fam, score, why)
			}
			tuned, err := Tune(context.Background(), fam, simulate.Tools(tt.target), pol, TuneConfig{})
			if err != nil {
				t.Fatal(err)
			}
			s := tuned.Result.Summary
			t.Logf("%d attempt(s), %s: %s", len(tuned.Attempts), tuned.Template.Knobs, s)
			if !tuned.Accepted || !s.Accepted || s.Mean < 0.2 || s.Mean > 0.6 || s.SuccessRate < 0.2 || s.SuccessRate > 0.6 {
				t.Fatalf("not calibrated inside the band: %s", s)
			}
			if !s.Simulated || !strings.Contains(s.Policy, "simulated") || !strings.HasPrefix(s.String(), "[SIMULATED]") {
				t.Errorf("the simulated policy's calibration is not labeled simulated: %s", s)
			}
			if _, ok := s.PassAtK(16); !ok {
				t.Error("no pass@16")
			}
		})
	}
}

// An agent without the deficit finds the environment too easy; the same
// capability lacking at 0.9 finds it too hard: the deficit, not the
// template, decides.
func TestSimulatedPolicyFollowsTheDeficit(t *testing.T) {
	tpl, err := Instantiate(PreconditionVerification, simulate.Tools(simulate.Airline), Knobs{})
	if err != nil {
		t.Fatal(err)
	}
	env := load(t, tpl)
	cfg := calibrate.DefaultConfig()
	cfg.Seeds = 50
	for _, tt := range []struct {
		deficit float64
		verdict string
	}{{0, calibrate.TooEasy}, {0.9, calibrate.TooHard}} {
		agent := simulate.AgentSpec{Name: "support-bot", Version: "9.9.9", Environments: []string{simulate.Airline},
			Deficits: map[string]float64{PreconditionVerification: tt.deficit}}
		res, err := calibrate.Run(context.Background(), env, simpolicy.NewSimulatedPolicy(agent, simulate.Airline, PreconditionVerification), tpl.CalibrationConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		if res.Summary.Verdict != tt.verdict {
			t.Errorf("deficit %v: %s, want %s", tt.deficit, res.Summary, tt.verdict)
		}
	}
}

// Tune turns the knobs: a smaller deficit than the default setting suits
// makes it climb the ladder; a policy no setting suits ends in
// ErrNotCalibrated with every attempt recorded.
func TestTuneTurnsKnobs(t *testing.T) {
	cfg := calibrate.DefaultConfig()
	cfg.Seeds = 60
	agent := simulate.AgentSpec{Name: "support-bot", Version: "2.0.0", Environments: []string{simulate.Airline},
		Deficits: map[string]float64{MultiStepCompletion: 0.3}}
	var seen []Attempt
	tuned, err := Tune(context.Background(), MultiStepCompletion, simulate.Tools(simulate.Airline),
		simpolicy.NewSimulatedPolicy(agent, simulate.Airline, MultiStepCompletion), TuneConfig{Calibration: cfg, Attempted: func(a Attempt) { seen = append(seen, a) }})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := Lookup(MultiStepCompletion)
	if len(tuned.Attempts) < 2 || tuned.Attempts[0].Summary.Verdict != calibrate.TooEasy || tuned.Template.Knobs.Steps <= f.DefaultKnobs().Steps {
		t.Fatalf("attempts %+v: want a too-easy default, then more steps", tuned.Attempts)
	}
	if len(seen) != len(tuned.Attempts) || !tuned.Accepted {
		t.Errorf("accepted %v after %d attempts (%d reported)", tuned.Accepted, len(tuned.Attempts), len(seen))
	}

	tuned, err = Tune(context.Background(), MultiStepCompletion, simulate.Tools(simulate.Airline), calibrate.OraclePolicy{}, TuneConfig{Calibration: cfg, MaxAttempts: 3})
	if !errors.Is(err, ErrNotCalibrated) || tuned == nil || tuned.Accepted || len(tuned.Attempts) != 3 {
		t.Fatalf("oracle: %v, %+v", err, tuned)
	}
	if !strings.Contains(err.Error(), "more constraints or steps") {
		t.Errorf("the error does not carry the diagnosis: %v", err)
	}
}

func TestMatch(t *testing.T) {
	tests := []struct {
		name, definition, want string
	}{
		{"precondition_verification", "", PreconditionVerification},
		{"Tool Error Recovery", "", ToolErrorRecovery},
		{"multi_step_transaction_completion", "The user request requires two or more sequential, dependent state-changing tool calls.", MultiStepCompletion},
		{"aggregation_across_records", "The task requires the agent to look up multiple records and then aggregate or compare across them.", StructuredDataReasoning},
		{"numerical_and_payment_reasoning", "The task requires arithmetic over money: computing totals, fees, refunds.", StructuredDataReasoning},
		{"policy_constraint_enforcement", "The agent must recognize when a user request would violate a policy constraint.", PreconditionVerification},
		{"handling_concurrent_user_intents", "The user introduces multiple distinct intents in a single message.", MultiStepCompletion},
		{"id_hallucination", "The agent invents identifiers instead of copying them from tool results.", ArgumentGrounding},
		{"asks_before_acting", "The agent obtains explicit confirmation from the user before a write.", UserConfirmation},
		{"greeting_style", "The agent greets the user warmly.", ""},
	}
	for _, tt := range tests {
		got, score, why := Match(tt.name, tt.definition)
		if got != tt.want {
			t.Errorf("Match(%q) = %q (%.2f, %s), want %q", tt.name, got, score, why, tt.want)
			continue
		}
		if why == "" || (got != "" && score < MinMatchScore) {
			t.Errorf("Match(%q): score %.2f, why %q", tt.name, score, why)
		}
	}
	if f, s, why := MatchDeclared("user_confirmation", "greeting_style", ""); f != UserConfirmation || s != 1 || !strings.Contains(why, "declares") {
		t.Errorf("declared family: %s %v %s", f, s, why)
	}
	if f, _, why := MatchDeclared("other", "precondition_verification", ""); f != "" || !strings.Contains(why, "other") {
		t.Errorf("declared other: %q %s", f, why)
	}
	if f, _, why := MatchDeclared("telepathy", "precondition_verification", ""); f != PreconditionVerification || !strings.Contains(why, "unknown family") {
		t.Errorf("declared unknown: %q %s", f, why)
	}
}

// The rewards score the capability: an agent that always lacks it never
// succeeds, one that never does always succeeds (no base failures), on
// every family and both targets. This is what makes the simulated
// calibrations above mean something.
func TestRewardsTrackTheCapability(t *testing.T) {
	cfg := calibrate.DefaultConfig()
	cfg.Seeds, cfg.Rollouts = 40, 4
	for _, target := range simulate.Environments {
		for _, fam := range Names() {
			tpl, err := Instantiate(fam, simulate.Tools(target), Knobs{})
			if err != nil {
				t.Fatal(err)
			}
			env := load(t, tpl)
			for _, deficit := range []float64{0, 1} {
				agent := simulate.AgentSpec{Name: "probe", Version: "0", Environments: []string{target}, Deficits: map[string]float64{fam: deficit}}
				p := simpolicy.NewSimulatedPolicy(agent, target, fam)
				p.BaseFailure, p.HintEffect = 0, 0
				res, err := calibrate.Run(context.Background(), env, p, tpl.CalibrationConfig(cfg))
				if err != nil {
					t.Fatal(err)
				}
				s := res.Summary
				if want := 1 - deficit; s.SuccessRate != want {
					t.Errorf("%s/%s, deficit %v: success %.3f, want %v (mean %.3f)", target, fam, deficit, s.SuccessRate, want, s.Mean)
				}
				if deficit == 1 && s.Mean >= 0.8 {
					t.Errorf("%s/%s: an agent always lacking the capability still earns a mean %.3f", target, fam, s.Mean)
				}
			}
		}
	}
}

func TestForRequest(t *testing.T) {
	req := &schemas.SynthesisRequest{
		Environment: simulate.Retail, AgentVersion: "1.5.0",
		Capability: schemas.SelectedCapability{Skill: "id_hallucination", Description: "The agent invents identifiers instead of copying them."},
		Tools:      simulate.Tools(simulate.Retail),
	}
	tpl, m, err := ForRequest(req, "")
	if err != nil || m.Family != ArgumentGrounding || tpl.Family != ArgumentGrounding || m.Why == "" {
		t.Fatalf("%+v %+v %v", tpl, m, err)
	}
	req.Capability = schemas.SelectedCapability{Skill: "greeting_style", Description: "The agent greets the user warmly."}
	if _, m, err := ForRequest(req, ""); !errors.Is(err, ErrNoFamily) || m.Family != "" || !strings.Contains(err.Error(), "greeting_style") {
		t.Errorf("no family: %+v %v", m, err)
	}
	if tpl, m, err := ForRequest(req, UserConfirmation); err != nil || tpl.Family != UserConfirmation || m.Score != 1 {
		t.Errorf("declared: %+v %v", m, err)
	}
	req.Tools = simulate.Tools(simulate.Retail)[:1] // calculate only
	var re *RoleError
	if _, _, err := ForRequest(req, UserConfirmation); !errors.As(err, &re) {
		t.Errorf("missing roles: %v", err)
	}
}

// Beyond the planted deficits: a simulated agent lacking any family's
// capability at 0.5 is calibrated inside the default bands by Tune, on
// both targets.
func TestTuneCalibratesEveryFamilyAtHalfDeficit(t *testing.T) {
	for _, target := range simulate.Environments {
		for _, fam := range Names() {
			agent := simulate.AgentSpec{Name: "probe", Version: "1", Environments: []string{target}, Deficits: map[string]float64{fam: 0.5}}
			tuned, err := Tune(context.Background(), fam, simulate.Tools(target), simpolicy.NewSimulatedPolicy(agent, target, fam), TuneConfig{})
			if err != nil {
				t.Errorf("%s/%s: %v", target, fam, err)
				continue
			}
			if !tuned.Accepted || !tuned.Result.Summary.Accepted {
				t.Errorf("%s/%s: not accepted: %s", target, fam, tuned.Result.Summary)
			}
		}
	}
}

// Tool and parameter names come from rollouts: one that would end the
// docstring stays inside it (the program runs in-process as trusted),
// quotes and backslashes included.
func TestToolNamesCannotInjectCode(t *testing.T) {
	evil := `get_booking\"""` + "\nfail(\"injected\")\n" + `"""`
	tools := []schemas.Tool{
		mkTool("find_member", `{"type":"object","properties":{"user_id":{"type":"string"}},"required":["user_id"]}`),
		mkTool(evil, `{"type":"object","properties":{"booking_id":{"type":"string"}},"required":["booking_id"]}`),
		mkTool("change_booking_seats", `{"type":"object","properties":{"booking_id":{"type":"string"},"seats":{"type":"integer"}},"required":["booking_id","seats"]}`),
	}
	for _, fam := range Names() {
		tpl, err := Instantiate(fam, tools, Knobs{})
		if err != nil {
			t.Fatalf("%s: %v", fam, err)
		}
		if !slices.Contains(sortedValues(tpl.Tools), evil) {
			t.Fatalf("%s: the roles %v do not use the tool named to inject", fam, tpl.Tools)
		}
		env := load(t, tpl)
		if doc := env.Info().Doc; !strings.HasPrefix(doc, tpl.Rationale) || !strings.Contains(doc, evil) {
			t.Errorf("%s: the docstring does not hold the rationale and the tool's name verbatim:\n%s", fam, doc)
		}
	}
}
