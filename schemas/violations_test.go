package schemas_test

import (
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/traceops/trace/schemas"
)

func TestPointer(t *testing.T) {
	for _, tt := range []struct {
		tokens []string
		want   string
	}{
		{nil, "/"},
		{[]string{"messages", "3", "content"}, "/messages/3/content"},
		{[]string{"a/b"}, "/a~1b"},
		{[]string{"c~d"}, "/c~0d"},
		{[]string{"~1"}, "/~01"}, // "~" first, so a literal "~1" does not read back as "/"
		{[]string{"x", "/~"}, "/x/~1~0"},
		{[]string{""}, "/"},
	} {
		if got := schemas.Pointer(tt.tokens); got != tt.want {
			t.Errorf("Pointer(%q) = %q, want %q", tt.tokens, got, tt.want)
		}
	}
}

// Violations flattens the error tree into its leaves, ordered by location,
// with escaped pointers and the failed keyword.
func TestViolations(t *testing.T) {
	c := jsonschema.NewCompiler()
	sch, err := jsonschema.UnmarshalJSON(strings.NewReader(`{"type":"object","properties":{
		"z":{"type":"integer"},"a/b":{"type":"string"},"m~n":{"type":"object","required":["k"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("s.json", sch); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(`{"z":"x","a/b":1,"m~n":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	var ve *jsonschema.ValidationError
	if err := s.Validate(doc); err == nil {
		t.Fatal("invalid document accepted")
	} else if ve, _ = err.(*jsonschema.ValidationError); ve == nil {
		t.Fatalf("%T: %v", err, err)
	}
	vs := schemas.Violations(ve)
	var paths, rules []string
	for _, v := range vs {
		paths, rules = append(paths, v.Path), append(rules, v.Rule)
		if v.Msg == "" {
			t.Errorf("%s: empty message", v.Path)
		}
	}
	if got, want := strings.Join(paths, " "), "/a~1b /m~0n /z"; got != want {
		t.Errorf("paths %q, want %q", got, want)
	}
	if got, want := strings.Join(rules, " "), "type required type"; got != want {
		t.Errorf("rules %q, want %q", got, want)
	}
}
