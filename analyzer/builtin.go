package analyzer

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
)

// builtinFS holds the dictionaries shipped with trace (analyzer/dictionaries).
//
//go:embed dictionaries/*.yaml
var builtinFS embed.FS

// BuiltinDictionaryFiles lists the embedded dictionary files, sorted.
func BuiltinDictionaryFiles() []string {
	names, _ := fs.Glob(builtinFS, "dictionaries/*.yaml")
	sort.Strings(names)
	return names
}

// BuiltinDictionaryYAML returns the text of one embedded dictionary file
// (e.g. "dictionaries/tau-tools.yaml").
func BuiltinDictionaryYAML(name string) ([]byte, error) {
	return builtinFS.ReadFile(name)
}

// BuiltinDictionaries parses every embedded dictionary: today
// dictionaries/tau-tools.yaml, the default dictionary (every environment
// "*", every agent version "*", version 1) with the capabilities
// precondition_verification, argument_grounding, multi_step_completion,
// tool_error_recovery and user_confirmation, each with a CEL detector for
// the rules labeler that reads only tool calls, their results and grader
// reasons. Every call returns fresh copies.
func BuiltinDictionaries() ([]*Dictionary, error) {
	var out []*Dictionary
	for _, name := range BuiltinDictionaryFiles() {
		b, err := builtinFS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		ds, err := ParseDictionaries(name, b)
		if err != nil {
			return nil, fmt.Errorf("builtin dictionary: %w", err)
		}
		out = append(out, ds...)
	}
	return out, nil
}

// BuiltinDictionary returns the embedded dictionary that labels an
// environment (its own, else the default for every environment), or nil.
func BuiltinDictionary(environment string) (*Dictionary, error) {
	ds, err := BuiltinDictionaries()
	if err != nil {
		return nil, err
	}
	var def *Dictionary
	for _, d := range ds {
		switch d.Environment {
		case environment:
			return d, nil
		case AnyEnvironment:
			def = d
		}
	}
	return def, nil
}
