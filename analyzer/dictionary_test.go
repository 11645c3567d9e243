package analyzer

import (
	"encoding/json"
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
