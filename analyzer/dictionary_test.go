package analyzer

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func TestDictionaryFamily(t *testing.T) {
	doc := func(family string) string {
		return `environment: sim-airline
agent_version: "*"
version: 1
capabilities:
  - name: precondition_verification
    definition: Before a write the agent reads the record it changes.
` + family
	}
	tests := []struct {
		name, family, want, err string
	}{
		{"absent", "", "", ""},
		{"known family", "    family: precondition_verification\n", "precondition_verification", ""},
		{"other", "    family: other\n", "other", ""},
		{"structured data", "    family: structured_data_reasoning\n", "structured_data_reasoning", ""},
		{"unknown", "    family: cooking\n", "", `capabilities[0].family "cooking" of "precondition_verification" is not one of precondition_verification, argument_grounding`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds, err := ParseDictionaries("d.yaml", []byte(doc(tt.family)))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := ds[0].Capabilities[0]
			if c.Family != tt.want {
				t.Fatalf("family %q, want %q", c.Family, tt.want)
			}
			// The stored form (JSON) keeps the family, and a dictionary
			// without one keeps the fingerprint it had before the field existed.
			b, _ := json.Marshal(c)
			if strings.Contains(string(b), "family") != (tt.want != "") {
				t.Fatalf("stored as %s", b)
			}
			row := DictionaryRow(ds[0])
			back, err := DictionaryFromRow(row)
			if err != nil || back.Capabilities[0].Family != tt.want {
				t.Fatalf("round trip through the stored row: %v %+v", err, back)
			}
		})
	}
}

func TestBuiltinDictionaryNamesFamilies(t *testing.T) {
	ds, err := BuiltinDictionaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		for _, c := range d.Capabilities {
			if c.Family != c.Name {
				t.Errorf("%s: capability %s has family %q, want its own name (one template family per shipped capability)", d.Environment, c.Name, c.Family)
			}
		}
	}
}

// TestParseDictionariesChecksDetectorsAndKeys: a detector the rules labeler
// could not use, or a key the format does not have, is refused when the
// file is parsed (trace dict apply, dictionary files of the configuration),
// naming the capability and the problem; the labeler's own Compile agrees
// with every verdict.
func TestParseDictionariesChecksDetectorsAndKeys(t *testing.T) {
	doc := func(top, caps string) string {
		return "environment: tau2-airline\nagent_version: \"*\"\nversion: 5\n" + top + "capabilities:\n" + caps
	}
	capability := func(name, detector string) string {
		s := "  - name: " + name + "\n    definition: Before a write the agent reads the record it changes.\n"
		if detector != "" {
			s += "    detector: " + strconv.Quote(detector) + "\n"
		}
		return s
	}
	one := func(detector string) string { return doc("", capability("precondition_verification", detector)) }
	tests := []struct {
		name, yaml string
		want       []string // substrings of the error; none: valid
	}{
		{"valid detector", one(`calls.exists(c, c.name == 'get_reservation_details') ? 'PRESENT' : 'NA'`), nil},
		{"no detector (llm labeler)", one(""), nil},
		{"every documented field", one(`rollout.reward == 1 && rollout.success && rollout.call_count > 0 && size(rollout.metadata) >= 0 &&
			messages.all(m, m.turn_idx >= -1 && m.tool_calls.all(n, n != '')) &&
			calls.all(c, c.seq >= 0 && (c.write || c.confirmed || c.has_result || c.error) || c.prior.contains(c.arg_values[0]) || 'x' in c.args)
			? 'PRESENT' : 'NA'`), nil},
		{"bool and a field that does not exist", one(`calls.exists(c, c.nme == 'x')`),
			[]string{`capability "precondition_verification"`, "detector does not compile", "undefined field 'nme'"}},
		{"bool", one(`calls.exists(c, c.name == 'x')`),
			[]string{`capability "precondition_verification"`, "detector returns bool, want string"}},
		{"dyn", one(`rollout.metadata.label`), []string{"detector returns dyn, want string"}},
		{"int", one(`size(calls)`), []string{"detector returns int, want string"}},
		{"undeclared variable", one(`rolout.success ? 'NA' : 'LACKING'`), []string{"undeclared reference to 'rolout'"}},
		{"field of a message", one(`messages.exists(m, m.text == 'x') ? 'NA' : 'PRESENT'`), []string{"undefined field 'text'"}},
		{"field of the rollout", one(`rollout.succeeded ? 'PRESENT' : 'LACKING'`), []string{"undefined field 'succeeded'"}},
		{"field of the wrong type", one(`rollout.success == 'true' ? 'PRESENT' : 'LACKING'`), []string{"no matching overload for '_==_' applied to '(bool, string)'"}},
		{"syntax error", one(`calls.exists(c, c.name == 'x' ? 'NA'`), []string{"Syntax error"}},
		{"every broken detector is named", doc("", capability("precondition_verification", `calls.exists(c, c.nme == 'x')`)+
			capability("argument_grounding", `'NA'`)+capability("user_confirmation", `size(calls) > 0`)),
			[]string{`capability "precondition_verification"`, `capability "user_confirmation"`, "returns bool"}},
		{"unknown top-level key", doc("unknown_field: 1\n", capability("precondition_verification", `'NA'`)),
			[]string{"d.yaml", `line 4: unknown key "unknown_field" (a dictionary's keys are environment, agent_version, version, source, created_at, capabilities)`}},
		{"unknown capability key", one(`'NA'`) + "    detecter: x\n",
			[]string{`line 8: unknown key "detecter" (a capability's keys are name, definition, examples, detector, family)`}},
	}
	lab := NewRulesLabeler(RulesOptions{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds, err := ParseDictionaries("d.yaml", []byte(tt.yaml))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if ds[0].Capabilities[0].Detector != "" {
					if err := lab.Compile(ds[0]); err != nil {
						t.Errorf("parsed, but the rules labeler does not compile it: %v", err)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted %+v, want an error with %q", ds, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// The labeler refuses what parsing refuses: the same compile path.
	for _, det := range []string{`calls.exists(c, c.nme == 'x')`, `calls.exists(c, c.name == 'x')`, `rollout.success == 'true' ? 'NA' : 'PRESENT'`} {
		c := Capability{Name: "precondition_verification", Definition: "Before a write the agent reads the record it changes.", Detector: det}
		d := &Dictionary{Environment: "e", AgentVersion: "*", Version: 1, Capabilities: []Capability{c}}
		verr, cerr := d.Validate(), lab.Compile(d)
		if verr == nil || cerr == nil || !strings.Contains(cerr.Error(), strings.SplitN(CheckDetector(c).Error(), "\n", 2)[0]) {
			t.Errorf("%s: Validate %v, labeler %v: want the same error from both", det, verr, cerr)
		}
	}
}
