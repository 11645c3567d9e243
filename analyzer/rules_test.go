package analyzer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"

	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/internal/dev/shareddata"
	"github.com/traceops/trace/schemas"
)

// --- a small builder of hand-made rollouts ---

type rb struct {
	r *schemas.Rollout
	n int
}

func newRollout() *rb {
	return &rb{r: &schemas.Rollout{
		RolloutID: "r1", Environment: "sim-airline", Agent: schemas.Agent{Name: "a", Version: "1"}, TaskID: "1",
		Outcome:  schemas.Outcome{Reward: 1},
		Messages: []schemas.Message{{Role: "system", Content: "policy: reservation ABC123 is an example"}},
	}}
}

func (b *rb) user(s string) *rb {
	b.r.Messages = append(b.r.Messages, schemas.Message{Role: "user", Content: s})
	return b
}

func (b *rb) asst(s string) *rb {
	b.r.Messages = append(b.r.Messages, schemas.Message{Role: "assistant", Content: s})
	return b
}

// call appends an assistant tool call and its result.
func (b *rb) call(name string, args map[string]any, result string) *rb {
	return b.callAs("assistant", name, args, result, false)
}

// fail appends an assistant tool call whose result has error=true.
func (b *rb) fail(name string, args map[string]any, result string) *rb {
	return b.callAs("assistant", name, args, result, true)
}

func (b *rb) callAs(requestor, name string, args map[string]any, result string, isErr bool) *rb {
	b.n++
	id := fmt.Sprintf("call_%d", b.n)
	b.r.Messages = append(b.r.Messages,
		schemas.Message{Role: "assistant", ToolCalls: []schemas.ToolCall{{ID: id, Name: name, Arguments: args, Requestor: requestor}}},
		schemas.Message{Role: "tool", ToolCallID: id, Content: result, Error: isErr, Requestor: requestor})
	return b
}

func (b *rb) meta(k string, v any) *rb {
	if b.r.Metadata == nil {
		b.r.Metadata = map[string]any{}
	}
	b.r.Metadata[k] = v
	return b
}

func (b *rb) reasons(rs ...string) *rb {
	b.r.Grader = &schemas.Grader{Reasons: rs}
	return b
}

type m = map[string]any

const resJSON = `{"reservation_id": "EHGLP3", "user_id": "emma_kim_9957", "flights": [{"flight_number": "HAT156", "date": "2024-05-17"}]}`

func tauTools(t *testing.T) *Dictionary {
	t.Helper()
	d, err := BuiltinDictionary("sim-airline")
	if err != nil || d == nil {
		t.Fatalf("built-in dictionary: %v", err)
	}
	return d
}

func TestRulesCapabilities(t *testing.T) {
	auth := func() *rb {
		return newRollout().
			user("Hi, I want to change reservation EHGLP3. My user id is emma_kim_9957.").
			call("get_user_details", m{"user_id": "emma_kim_9957"}, `{"user_id": "emma_kim_9957", "payment_methods": {"credit_card_4421216": {}}, "reservations": ["EHGLP3", "Q69X3R"]}`)
	}
	cases := []struct {
		name, capability, want string
		r                      *rb
	}{
		// precondition_verification
		{"no write", "precondition_verification", "NA",
			auth().call("get_reservation_details", m{"reservation_id": "EHGLP3"}, resJSON).asst("Here are the details.")},
		{"read then cancel", "precondition_verification", "PRESENT",
			auth().call("get_reservation_details", m{"reservation_id": "EHGLP3"}, resJSON).user("yes").
				call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"cancel without reading", "precondition_verification", "LACKING",
			auth().user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"read another reservation", "precondition_verification", "LACKING",
			auth().call("get_reservation_details", m{"reservation_id": "Q69X3R"}, resJSON).user("yes").
				call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"failed read does not count", "precondition_verification", "LACKING",
			auth().fail("get_reservation_details", m{"reservation_id": "EHGLP3"}, "Error: Reservation not found").user("yes").
				call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"read after the write", "precondition_verification", "LACKING",
			auth().user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON).
				call("get_reservation_details", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"user-level write after get_user_details", "precondition_verification", "PRESENT",
			auth().user("yes").call("send_certificate", m{"user_id": "emma_kim_9957", "amount": 100}, "Certificate added")},
		{"user-side tool calls are not the agent's", "precondition_verification", "NA",
			newRollout().user("ok").callAs("user", "toggle_airplane_mode", m{}, "Airplane mode is now OFF", false)},

		// argument_grounding
		{"no write", "argument_grounding", "NA", auth()},
		{"flight number from the search result", "argument_grounding", "PRESENT",
			auth().call("search_direct_flight", m{"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}, `[{"flight_number": "HAT271"}]`).user("yes").
				call("update_reservation_flights", m{"reservation_id": "EHGLP3", "cabin": "economy", "flights": []any{m{"flight_number": "HAT271", "date": "2024-05-20"}}, "payment_id": "credit_card_4421216"}, resJSON)},
		{"invented flight number", "argument_grounding", "LACKING",
			auth().call("search_direct_flight", m{"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}, `[{"flight_number": "HAT271"}]`).user("yes").
				call("update_reservation_flights", m{"reservation_id": "EHGLP3", "cabin": "economy", "flights": []any{m{"flight_number": "HAT999", "date": "2024-05-20"}}, "payment_id": "credit_card_4421216"}, resJSON)},
		{"invented payment id nested in a list", "argument_grounding", "LACKING",
			auth().user("yes").call("book_reservation", m{"user_id": "emma_kim_9957", "payment_methods": []any{m{"payment_id": "gift_card_7777777", "amount": 120}}}, "{}")},
		{"order id with a # the user left out", "argument_grounding", "PRESENT",
			newRollout().user("Please cancel order W2378156, yes.").call("cancel_pending_order", m{"order_id": "#W2378156", "reason": "no longer needed"}, "{}")},
		{"short and free-text values are not identifiers", "argument_grounding", "PRESENT",
			auth().user("yes").call("update_reservation_baggages", m{"reservation_id": "EHGLP3", "total_baggages": 2, "nonfree_baggages": 1, "payment_id": "credit_card_4421216"}, resJSON)},
		{"identifier only in the agent's own words", "argument_grounding", "LACKING",
			auth().asst("I'll use your card credit_card_1234567.").user("yes").
				call("update_reservation_baggages", m{"reservation_id": "EHGLP3", "total_baggages": 2, "nonfree_baggages": 1, "payment_id": "credit_card_1234567"}, resJSON)},
		{"identifier only in the system policy", "argument_grounding", "LACKING",
			newRollout().user("yes").call("cancel_reservation", m{"reservation_id": "ABC123"}, "{}")},

		// multi_step_completion
		{"one required write", "multi_step_completion", "NA",
			auth().meta("required_actions", []any{"get_user_details", "cancel_reservation"}).user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"reads only", "multi_step_completion", "NA",
			auth().meta("required_actions", []string{"get_user_details", "get_reservation_details"})},
		{"both required writes done", "multi_step_completion", "PRESENT",
			auth().meta("required_actions", []string{"get_user_details", "cancel_reservation", "update_reservation_baggages"}).user("yes").
				call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON).
				call("update_reservation_baggages", m{"reservation_id": "Q69X3R"}, resJSON)},
		{"second required write missing", "multi_step_completion", "LACKING",
			auth().meta("required_actions", []string{"cancel_reservation", "update_reservation_baggages"}).user("yes").
				call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"two cancels required, one done", "multi_step_completion", "LACKING",
			auth().meta("required_actions", []string{"cancel_reservation", "cancel_reservation"}).user("yes").
				call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"a failed write does not count", "multi_step_completion", "LACKING",
			auth().meta("required_actions", []string{"cancel_reservation", "update_reservation_baggages"}).user("yes").
				call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON).
				fail("update_reservation_baggages", m{"reservation_id": "Q69X3R"}, "Error: Not enough balance")},
		{"no required actions: two writes in evidence", "multi_step_completion", "PRESENT",
			auth().user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON).
				call("cancel_reservation", m{"reservation_id": "Q69X3R"}, resJSON)},
		{"no required actions: the grader names a missing write", "multi_step_completion", "LACKING",
			auth().reasons("db: final database state differs from the expected one", `action: expected call update_reservation_baggages({"reservation_id":"Q69X3R"}) not made`).
				user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"no required actions: a write made with other arguments is not skipped", "multi_step_completion", "NA",
			auth().reasons(`action: expected call cancel_reservation({"reservation_id":"Q69X3R"}) not made`).
				user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"no required actions: two of three made", "multi_step_completion", "LACKING",
			auth().reasons(`action: expected call cancel_reservation({"reservation_id":"EHGLP3"}) not made`,
				`action: expected call modify_user_address({"user_id":"emma_kim_9957"}) not made`,
				`action: expected call get_order_details({"order_id":"#W1"}) not made`).
				user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON).
				call("update_reservation_baggages", m{"reservation_id": "Q69X3R"}, resJSON)},
		{"no required actions: one write", "multi_step_completion", "NA",
			auth().user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},

		// tool_error_recovery
		{"no error", "tool_error_recovery", "NA", auth()},
		{"error then corrected retry", "tool_error_recovery", "PRESENT",
			newRollout().user("my id is emma_kim_9975").fail("get_user_details", m{"user_id": "emma_kim_9975"}, "Error: User not found").
				user("sorry, emma_kim_9957").call("get_user_details", m{"user_id": "emma_kim_9957"}, "{}")},
		{"error text without the flag, no retry", "tool_error_recovery", "LACKING",
			auth().call("exchange_delivered_order_items", m{"order_id": "#W1"}, "Error: New item 3778566150 not found or available").
				asst("Sorry, I can't do that.")},
		{"sibling lookup after an error", "tool_error_recovery", "PRESENT",
			newRollout().fail("find_user_id_by_email", m{"email": "x@example.com"}, "Error: User not found").
				call("find_user_id_by_name_zip", m{"first_name": "Raj", "last_name": "Santos", "zip": "98157"}, "raj_santos_9079")},
		{"transfer after an error", "tool_error_recovery", "LACKING",
			auth().fail("update_reservation_baggages", m{"reservation_id": "EHGLP3"}, "Error: Not enough balance in payment method gift_card_1").
				call("transfer_to_human_agents", m{"summary": "payment failed"}, "Transfer successful")},
		{"a retry that fails again", "tool_error_recovery", "LACKING",
			auth().fail("get_order_details", m{"order_id": "W1"}, "Error: Order not found").
				fail("get_order_details", m{"order_id": "#W1"}, "Error: Order not found")},
		{"user-side errors are not the agent's", "tool_error_recovery", "NA",
			newRollout().callAs("user", "toggle_data", m{}, "Error: no SIM card", true)},

		// user_confirmation
		{"no write", "user_confirmation", "NA", auth()},
		{"yes before the write", "user_confirmation", "PRESENT",
			auth().asst("Shall I cancel EHGLP3? (yes/no)").user("Yes, please go ahead.").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"write right after the request", "user_confirmation", "LACKING",
			auth().call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"one yes covers consecutive writes", "user_confirmation", "PRESENT",
			auth().user("YES — proceed with both.").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON).
				call("cancel_reservation", m{"reservation_id": "Q69X3R"}, resJSON)},
		{"other affirmatives", "user_confirmation", "PRESENT",
			auth().user("Oui, go ahead").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
		{"a later user turn without consent", "user_confirmation", "LACKING",
			auth().user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON).
				user("Now add a bag to Q69X3R.").call("update_reservation_baggages", m{"reservation_id": "Q69X3R"}, resJSON)},
		{"'yesterday' is not a yes", "user_confirmation", "LACKING",
			auth().user("I booked it yesterday.").call("cancel_reservation", m{"reservation_id": "EHGLP3"}, resJSON)},
	}
	d := tauTools(t)
	lab := NewRulesLabeler(RulesOptions{})
	for _, tc := range cases {
		t.Run(tc.capability+"/"+tc.name, func(t *testing.T) {
			runs, err := lab.Label(context.Background(), d, tc.r.r)
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) != 1 || runs[0].Run != 0 || runs[0].Failed != "" {
				t.Fatalf("runs = %+v", runs)
			}
			if len(runs[0].Labels) != len(d.Capabilities) {
				t.Fatalf("want one label per capability, got %v", runs[0].Labels)
			}
			if got := runs[0].Labels[tc.capability]; got != tc.want {
				t.Errorf("%s = %s, want %s (all labels %v)", tc.capability, got, tc.want, runs[0].Labels)
			}
			// The same after a JSON round trip (numbers become float64,
			// []string becomes []any).
			b, _ := json.Marshal(tc.r.r)
			dec, err := schemas.DecodeRollout(b, schemas.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			runs2, err := lab.Label(context.Background(), d, dec)
			if err != nil || runs2[0].Labels[tc.capability] != tc.want {
				t.Errorf("after a JSON round trip: %+v, %v", runs2, err)
			}
		})
	}
}

func dictWith(detectors ...string) *Dictionary {
	d := &Dictionary{Environment: "e", AgentVersion: "*", Version: 1}
	names := []string{"first_capability", "second_capability", "third_capability"}
	for i, det := range detectors {
		d.Capabilities = append(d.Capabilities, Capability{Name: names[i], Definition: "a definition that is long enough", Detector: det})
	}
	return d
}

func TestRulesFailedRuns(t *testing.T) {
	r := newRollout().user("hi").r
	cases := []struct {
		name, detector, want string
	}{
		{"not a label", `'MAYBE'`, `capability second_capability: detector returned MAYBE, want NA, PRESENT or LACKING`},
		{"lower case is not a label", `'present'`, `detector returned present`},
		{"evaluation error", `rollout.metadata.no_such_key == 1 ? 'NA' : 'PRESENT'`, `capability second_capability: detector failed: no such key: no_such_key`},
		{"conditional to a non-label", `size(calls) > 0 ? 'NA' : ''`, `detector returned , want`},
	}
	lab := NewRulesLabeler(RulesOptions{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runs, err := lab.Label(context.Background(), dictWith(`'NA'`, tc.detector), r)
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) != 1 || runs[0].Labels != nil || !strings.Contains(runs[0].Failed, tc.want) {
				t.Fatalf("runs = %+v, want a failed run with %q", runs, tc.want)
			}
			if ev := Events(dictWith(`'NA'`, tc.detector), r, "rules", runs); len(ev) != 0 {
				t.Errorf("a failed run produced label events: %+v", ev)
			}
		})
	}
}

func TestRulesDictionaryErrors(t *testing.T) {
	r := newRollout().r
	cases := []struct {
		name      string
		detectors []string
		want      []string
	}{
		{"syntax error", []string{`'NA'`, `calls.exists(c, c.name == 'x' ? 'NA'`}, []string{`capability "second_capability"`, "does not compile", "Syntax error"}},
		{"undeclared variable", []string{`'NA'`, `'NA'`, `rolout.success ? 'NA' : 'LACKING'`}, []string{`capability "third_capability"`, "does not compile", "undeclared reference to 'rolout'"}},
		{"not a string", []string{`size(calls)`}, []string{`capability "first_capability"`, "returns int, want string"}},
		{"dyn is not enough", []string{`rollout.metadata.label`}, []string{`capability "first_capability"`, "returns dyn, want string"}},
		{"empty detector", []string{`'NA'`, ` `}, []string{`capability "second_capability"`, "no detector"}},
	}
	lab := NewRulesLabeler(RulesOptions{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := dictWith(tc.detectors...)
			err := lab.Compile(d)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), "dictionary e/* v1") {
				t.Errorf("error %q does not name the dictionary", err)
			}
			// Label fails the run with it: no label, and no error that a
			// stream would retry.
			runs, lerr := lab.Label(context.Background(), d, r)
			if lerr != nil || len(runs) != 1 || runs[0].Failed != err.Error() || runs[0].Labels != nil {
				t.Errorf("Label = %+v, %v; want run 0 failed with %q", runs, lerr, err)
			}
		})
	}
	if err := lab.Compile(dictWith(`'NA'`, ``)); !errors.Is(err, ErrNoDetector) {
		t.Errorf("empty detector: %v, want ErrNoDetector", err)
	}
}

func TestRulesLabelerBasics(t *testing.T) {
	lab := NewRulesLabeler(RulesOptions{})
	var _ Labeler = lab
	if lab.Name() != "rules" || lab.Runs() != 1 {
		t.Errorf("Name, Runs = %q, %d", lab.Name(), lab.Runs())
	}
	d := dictWith(`rollout.success ? 'PRESENT' : 'LACKING'`, `size(messages) > 1 ? 'NA' : 'LACKING'`)
	if err := lab.Compile(d); err != nil {
		t.Fatal(err)
	}
	if len(lab.cache) != 1 {
		t.Errorf("cache has %d entries", len(lab.cache))
	}
	r := newRollout().user("hi").r
	r.Outcome.Reward = 0.5
	runs, err := lab.Label(context.Background(), d, r)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"first_capability": "LACKING", "second_capability": "NA"}
	if fmt.Sprint(runs[0].Labels) != fmt.Sprint(want) {
		t.Errorf("labels %v, want %v", runs[0].Labels, want)
	}
	if len(lab.cache) != 1 {
		t.Errorf("labeling recompiled: cache has %d entries", len(lab.cache))
	}
	// A changed detector is a new fingerprint.
	d2 := dictWith(`'NA'`, `'NA'`)
	if _, err := lab.Label(context.Background(), d2, r); err != nil || len(lab.cache) != 2 {
		t.Errorf("err %v, cache %d", err, len(lab.cache))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := lab.Label(ctx, d, r); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	// Custom write prefixes.
	lab2 := NewRulesLabeler(RulesOptions{WritePrefixes: []string{"frobnicate_"}})
	d3 := dictWith(`calls.exists(c, c.write) ? 'PRESENT' : 'NA'`, `write_prefixes == ['frobnicate_'] ? 'NA' : 'LACKING'`)
	runs, err = lab2.Label(context.Background(), d3, newRollout().call("frobnicate_widget", m{}, "ok").r)
	if err != nil || runs[0].Labels["first_capability"] != "PRESENT" || runs[0].Labels["second_capability"] != "NA" {
		t.Errorf("custom prefixes: %+v %v", runs, err)
	}
}

func TestRuleVariables(t *testing.T) {
	turn := 3
	r := newRollout().user("My id is emma_kim_9957, yes go ahead").
		call("get_user_details", m{"user_id": "emma_kim_9957"}, `{"payment": "credit_card_4421216"}`).
		meta("required_actions", []string{"cancel_reservation"}).reasons("db: differs").r
	r.Messages = append(r.Messages, schemas.Message{Role: "assistant", TurnIdx: &turn, ToolCalls: []schemas.ToolCall{
		{ID: "x1", Name: "update_reservation_baggages", Arguments: m{"reservation_id": "EHGLP3", "total_baggages": 2, "flights": []any{m{"b": "B", "a": 1.5}}, "insurance": nil, "ok": true}},
		{ID: "x2", Name: "cancel_reservation", Arguments: m{"reservation_id": "EHGLP3"}, Requestor: "user"},
	}})
	r.Messages = append(r.Messages, schemas.Message{Role: "tool", ToolCallID: "x1", Content: "Error: nope", Error: true})
	v := RuleVariables(r, nil)
	calls := v["calls"].([]any)
	if len(calls) != 3 {
		t.Fatalf("calls = %v", calls)
	}
	c := calls[1].(map[string]any)
	checks := map[string]any{
		"index": int64(4), "seq": int64(1), "name": "update_reservation_baggages", "requestor": "assistant",
		"result": "Error: nope", "error": true, "has_result": true, "result_index": int64(5), "confirmed": true, "write": true,
		"prior": "My id is emma_kim_9957, yes go ahead\n{\"payment\": \"credit_card_4421216\"}",
	}
	for k, want := range checks {
		if c[k] != want {
			t.Errorf("calls[1].%s = %#v, want %#v", k, c[k], want)
		}
	}
	if got := fmt.Sprint(c["arg_values"]); got != "[1.5 B true EHGLP3 2]" {
		t.Errorf("arg_values = %s", got)
	}
	if c["args"].(map[string]any)["total_baggages"] != 2.0 {
		t.Errorf("numbers must be doubles: %#v", c["args"])
	}
	c2 := calls[2].(map[string]any)
	if c2["requestor"] != "user" || c2["has_result"] != false || c2["result"] != "" {
		t.Errorf("calls[2] = %v", c2)
	}
	ro := v["rollout"].(map[string]any)
	if ro["message_count"] != int64(6) || ro["call_count"] != int64(3) || ro["success"] != true ||
		fmt.Sprint(ro["grader_reasons"]) != "[db: differs]" || fmt.Sprint(ro["metadata"].(map[string]any)["required_actions"]) != "[cancel_reservation]" {
		t.Errorf("rollout = %v", ro)
	}
	msgs := v["messages"].([]any)
	if msgs[4].(map[string]any)["turn_idx"] != int64(3) || msgs[0].(map[string]any)["turn_idx"] != int64(-1) ||
		fmt.Sprint(msgs[4].(map[string]any)["tool_calls"]) != "[update_reservation_baggages cancel_reservation]" {
		t.Errorf("messages = %v", msgs)
	}
}

func TestBuiltinDictionaries(t *testing.T) {
	ds, err := BuiltinDictionaries()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"precondition_verification", "argument_grounding", "multi_step_completion", "tool_error_recovery", "user_confirmation"}
	var envs []string
	lab := NewRulesLabeler(RulesOptions{})
	for _, d := range ds {
		envs = append(envs, d.Environment)
		if d.AgentVersion != AnyVersion || d.Version != 1 {
			t.Errorf("%s: agent_version %q version %d", d.Environment, d.AgentVersion, d.Version)
		}
		if !slices.Equal(d.Names(), want) {
			t.Errorf("%s: capabilities %v", d.Environment, d.Names())
		}
		for _, c := range d.Capabilities {
			if n := strings.Count(c.Definition, ". "); n < 1 || n > 3 || strings.Contains(c.Definition, "\n") {
				t.Errorf("%s: definition of %s should be 2-3 sentences on one line: %q", d.Environment, c.Name, c.Definition)
			}
		}
		if d.Fingerprint() != ds[0].Fingerprint() {
			t.Errorf("%s: capabilities differ from %s's", d.Environment, ds[0].Environment)
		}
		if err := lab.Compile(d); err != nil {
			t.Error(err)
		}
	}
	// One default dictionary, for every environment and agent version.
	if !slices.Equal(envs, []string{AnyEnvironment}) || !ds[0].IsDefault() {
		t.Errorf("environments %v", envs)
	}
	if d, err := BuiltinDictionary("nowhere"); d == nil || err != nil || !d.IsDefault() {
		t.Errorf("BuiltinDictionary(nowhere) = %v, %v; want the default", d, err)
	}
	b, err := BuiltinDictionaryYAML("dictionaries/tau-tools.yaml")
	if err != nil || !strings.Contains(string(b), "precondition_verification") {
		t.Errorf("BuiltinDictionaryYAML: %v", err)
	}
}

// TestRulesOnTau2 runs the built-in detectors over the real τ²-bench result
// files in shared/data: every run must succeed, and the label mix must be
// plausible (writes are confirmed most of the time, errors occur).
func TestRulesOnTau2(t *testing.T) {
	dir := shareddata.Dir(t, "tau2")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) == 0 {
		t.Skip("no τ² result files")
	}
	base := tauTools(t)
	lab := NewRulesLabeler(RulesOptions{})
	for _, f := range files {
		rs, err := ingest.ConvertTau2File(f)
		if err != nil {
			t.Fatal(err)
		}
		d := *base
		d.Environment = rs[0].Environment
		dist := map[string]map[string]int{}
		for _, r := range rs {
			runs, err := lab.Label(context.Background(), &d, r)
			if err != nil {
				t.Fatal(err)
			}
			if runs[0].Failed != "" {
				t.Fatalf("%s: %s: %s", filepath.Base(f), r.RolloutID, runs[0].Failed)
			}
			for c, l := range runs[0].Labels {
				if dist[c] == nil {
					dist[c] = map[string]int{}
				}
				outcome := "+"
				if !r.Succeeded() {
					outcome = "-"
				}
				dist[c][l+outcome]++
			}
		}
		for _, c := range d.Names() {
			t.Logf("%s %-26s %v", filepath.Base(f), c, dist[c])
		}
		if dist["user_confirmation"]["PRESENT+"]+dist["user_confirmation"]["PRESENT-"] == 0 {
			t.Errorf("%s: no confirmed write at all", filepath.Base(f))
		}
		if n := dist["tool_error_recovery"]; n["PRESENT+"]+n["PRESENT-"]+n["LACKING+"]+n["LACKING-"] == 0 {
			t.Errorf("%s: no tool error seen", filepath.Base(f))
		}
	}
}

func TestRulesConcurrent(t *testing.T) {
	d := tauTools(t)
	lab := NewRulesLabeler(RulesOptions{})
	r := newRollout().user("yes").call("cancel_reservation", m{"reservation_id": "ZZ9999"}, "{}").r
	errs := make(chan error)
	for range 4 {
		go func() {
			for range 20 {
				runs, err := lab.Label(context.Background(), d, r)
				if err == nil && runs[0].Labels["precondition_verification"] != "LACKING" {
					err = fmt.Errorf("labels %v", runs[0].Labels)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestRuleTypesMatchVariables: the object types the checker knows
// (ruletypes.go) have exactly the keys RuleVariables writes, with values of
// the declared types, so a detector that type-checks reads what exists.
func TestRuleTypesMatchVariables(t *testing.T) {
	turn := 1
	r := newRollout().user("yes").call("cancel_reservation", m{"reservation_id": "EHGLP3", "n": 2}, "ok").
		fail("get_user_details", m{}, "Error").meta("required_actions", []string{"x"}).r
	r.Grader = &schemas.Grader{Reasons: []string{"db"}, Breakdown: map[string]float64{"DB": 1}}
	r.Messages[1].TurnIdx = &turn
	v := RuleVariables(r, nil)
	check := func(what string, s *ruleStruct, val any) {
		obj, ok := val.(map[string]any)
		if !ok {
			t.Fatalf("%s is %T, want a map", what, val)
		}
		if got, want := slices.Sorted(maps.Keys(obj)), slices.Sorted(slices.Values(s.FieldNames())); !slices.Equal(got, want) {
			t.Errorf("%s: RuleVariables writes %v, %s declares %v", what, got, s.name, want)
		}
		for _, f := range s.fields {
			x, present := obj[f.name]
			if !present {
				continue
			}
			var ok bool
			switch f.t.Kind() {
			case types.DynKind:
				ok = true
			case types.StringKind:
				_, ok = x.(string)
			case types.BoolKind:
				_, ok = x.(bool)
			case types.IntKind:
				_, ok = x.(int64)
			case types.DoubleKind:
				_, ok = x.(float64)
			case types.ListKind:
				_, ok = x.([]any)
			case types.MapKind:
				_, ok = x.(map[string]any)
			}
			if !ok {
				t.Errorf("%s.%s is %T, declared %s", what, f.name, x, cel.FormatCELType(f.t))
			}
		}
	}
	check("rollout", ruleRolloutType, v["rollout"])
	for i, msg := range v["messages"].([]any) {
		check(fmt.Sprintf("messages[%d]", i), ruleMessageType, msg)
	}
	calls := v["calls"].([]any)
	if len(calls) != 2 {
		t.Fatalf("%d calls", len(calls))
	}
	for i, c := range calls {
		check(fmt.Sprintf("calls[%d]", i), ruleCallType, c)
	}
}
