package analyzer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Capability is one entry of a capability dictionary.
type Capability struct {
	// Name is snake_case, 2–5 words; labelers may never invent or rename one.
	Name string `yaml:"name" json:"name"`
	// Definition lets an analyst decide NA / PRESENT / LACKING (2–3 sentences).
	Definition string `yaml:"definition" json:"definition"`
	// Examples are example trajectory (rollout) ids.
	Examples []string `yaml:"examples,omitempty" json:"examples,omitempty"`
	// Detector is the rules labeler's CEL expression returning "NA",
	// "PRESENT" or "LACKING". Empty for dictionaries labeled only by an LLM.
	Detector string `yaml:"detector,omitempty" json:"detector,omitempty"`
	// Family names the built-in environment template family the capability
	// belongs to (one of TemplateFamilies), or FamilyOther for none; empty
	// lets the synthesizer match the name and definition to a family.
	Family string `yaml:"family,omitempty" json:"family,omitempty"`
}

// FamilyOther is the Family of a capability that belongs to no template family.
const FamilyOther = "other"

// TemplateFamilies are the families of the synthesizer's built-in
// environment templates (synthesizer/templates): the five capabilities of
// the shipped rules dictionary and TRACE's structured-data reasoning. A
// dictionary's family must be one of them or FamilyOther.
var TemplateFamilies = []string{
	"precondition_verification",
	"argument_grounding",
	"multi_step_completion",
	"tool_error_recovery",
	"user_confirmation",
	"structured_data_reasoning",
}

// FamilySummaries say in one line what each template family practises (the
// discovery prompt shows them).
var FamilySummaries = map[string]string{
	"precondition_verification": "reading a record with a lookup tool before changing it, and acting on its current state",
	"argument_grounding":        "passing to write tools only identifiers copied from earlier tool results or the user",
	"multi_step_completion":     "carrying out every step a multi-part request needs, to the end",
	"tool_error_recovery":       "reacting correctly to a tool error instead of ignoring or repeating it",
	"user_confirmation":         "asking the user to confirm before a consequential write",
	"structured_data_reasoning": "computing over several records (totals, comparisons, filters) before answering or acting",
}

// ValidFamily reports whether f may be a capability's Family ("" included).
func ValidFamily(f string) bool {
	return f == "" || f == FamilyOther || slices.Contains(TemplateFamilies, f)
}

// Dictionary is a frozen, versioned set of capabilities scoped to one
// (environment, agent version). A new name means a new version.
type Dictionary struct {
	Environment  string       `yaml:"environment" json:"environment"`
	AgentVersion string       `yaml:"agent_version" json:"agent_version"`
	Version      uint32       `yaml:"version" json:"version"`
	Source       string       `yaml:"source,omitempty" json:"source,omitempty"` // file | discovery
	CreatedAt    time.Time    `yaml:"created_at,omitempty" json:"created_at,omitzero"`
	Capabilities []Capability `yaml:"capabilities" json:"capabilities"`
}

// MaxCapabilities bounds a dictionary (TRACE proposes at most 10).
const MaxCapabilities = 10

var capNameRe = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+){1,4}$`)

// Validate checks a dictionary; errors name the field. Every detector
// present is compiled and type-checked as the rules labeler compiles it
// (CheckDetector): one that does not compile, names a variable or field
// that does not exist, or does not return a string is an error naming the
// capability, and every such detector is reported. A capability without a
// detector is valid (an LLM-labeled dictionary).
func (d *Dictionary) Validate() error {
	if d.Environment == "" {
		return fmt.Errorf("dictionary: environment is required")
	}
	if d.AgentVersion == "" {
		return fmt.Errorf("dictionary %s: agent_version is required (use \"*\" for every version)", d.Environment)
	}
	if d.Version == 0 {
		return fmt.Errorf("dictionary %s/%s: version must be >= 1", d.Environment, d.AgentVersion)
	}
	if n := len(d.Capabilities); n == 0 || n > MaxCapabilities {
		return fmt.Errorf("dictionary %s/%s v%d: %d capabilities, want 1 to %d", d.Environment, d.AgentVersion, d.Version, n, MaxCapabilities)
	}
	seen := map[string]bool{}
	for i, c := range d.Capabilities {
		if !capNameRe.MatchString(c.Name) {
			return fmt.Errorf("dictionary %s/%s v%d: capabilities[%d].name %q is not snake_case of 2-5 words", d.Environment, d.AgentVersion, d.Version, i, c.Name)
		}
		if seen[c.Name] {
			return fmt.Errorf("dictionary %s/%s v%d: capabilities[%d].name %q appears twice", d.Environment, d.AgentVersion, d.Version, i, c.Name)
		}
		seen[c.Name] = true
		if len(c.Definition) < 20 {
			return fmt.Errorf("dictionary %s/%s v%d: capabilities[%d].definition of %q is too short to label against", d.Environment, d.AgentVersion, d.Version, i, c.Name)
		}
		if !ValidFamily(c.Family) {
			return fmt.Errorf("dictionary %s/%s v%d: capabilities[%d].family %q of %q is not one of %s or %q", d.Environment, d.AgentVersion, d.Version, i, c.Family, c.Name, strings.Join(TemplateFamilies, ", "), FamilyOther)
		}
	}
	var errs []error
	for i, c := range d.Capabilities {
		if strings.TrimSpace(c.Detector) == "" {
			continue
		}
		if err := CheckDetector(c); err != nil {
			errs = append(errs, fmt.Errorf("dictionary %s/%s v%d: capability %q (capabilities[%d].detector): %w", d.Environment, d.AgentVersion, d.Version, c.Name, i, err))
		}
	}
	return errors.Join(errs...)
}

// Names lists the capability names in dictionary order.
func (d *Dictionary) Names() []string {
	out := make([]string, len(d.Capabilities))
	for i, c := range d.Capabilities {
		out[i] = c.Name
	}
	return out
}

// Lookup finds a capability by name.
func (d *Dictionary) Lookup(name string) (Capability, bool) {
	for _, c := range d.Capabilities {
		if c.Name == name {
			return c, true
		}
	}
	return Capability{}, false
}

// Fingerprint identifies the content (names and definitions) of a dictionary.
func (d *Dictionary) Fingerprint() string {
	b, _ := json.Marshal(d.Capabilities)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// ParseDictionaries reads one or more YAML documents, each a Dictionary, and
// validates them (Validate: detectors included). A key the format does not
// have (a misspelt detector, say) is an error.
func ParseDictionaries(name string, data []byte) ([]*Dictionary, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var out []*Dictionary
	for {
		var d Dictionary
		err := dec.Decode(&d)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("%s: %w", name, unknownKeys(err))
		}
		if err := d.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, &d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no dictionary", name)
	}
	return out, nil
}

// yamlUnknownKey is the YAML decoder's message for a key a struct lacks.
var yamlUnknownKey = regexp.MustCompile(`field (\S+) not found in type analyzer\.(Dictionary|Capability)`)

// unknownKeys rewrites the YAML decoder's unknown-key messages ("field x
// not found in type analyzer.Capability") in the file's terms: the key,
// where it is, and the keys that are there.
func unknownKeys(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	keys := map[string]string{
		"Dictionary": "a dictionary's keys are " + yamlKeys(reflect.TypeFor[Dictionary]()),
		"Capability": "a capability's keys are " + yamlKeys(reflect.TypeFor[Capability]()),
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = yamlUnknownKey.ReplaceAllStringFunc(m, func(s string) string {
			sub := yamlUnknownKey.FindStringSubmatch(s)
			return fmt.Sprintf("unknown key %q (%s)", sub[1], keys[sub[2]])
		})
	}
	return errors.New(strings.Join(msgs, "; "))
}

// yamlKeys lists the YAML keys of struct type t.
func yamlKeys(t reflect.Type) string {
	var keys []string
	for f := range t.Fields() {
		if k, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); k != "" && k != "-" {
			keys = append(keys, k)
		}
	}
	return strings.Join(keys, ", ")
}

// WithoutDetector names the capabilities that have no detector: the
// rules labeler cannot label them.
func (d *Dictionary) WithoutDetector() []string {
	var out []string
	for _, c := range d.Capabilities {
		if strings.TrimSpace(c.Detector) == "" {
			out = append(out, c.Name)
		}
	}
	return out
}
