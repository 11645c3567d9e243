package analyzer

// ruletypes.go declares the shape of the rules labeler's variables to CEL's
// type checker. RuleVariables builds plain maps; declaring rollout,
// messages[] and calls[] as object types with these fields lets the checker
// reject a detector that names a field that does not exist (c.nme) or uses
// one with the wrong type, when the dictionary is applied rather than on
// every rollout. At evaluation the fields are read from the maps.

import (
	"fmt"
	"reflect"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// ruleField is one declared field of a rule variable.
type ruleField struct {
	name string
	t    *types.Type
}

// ruleStruct is a CEL object type backed by a map[string]any with exactly
// the declared keys (RuleVariables writes every key, zero values included).
// It implements ref.Type and types.StructTypeDescriptor, so cel.Types
// registers it.
type ruleStruct struct {
	name   string
	fields []ruleField
}

var (
	stringMap  = cel.MapType(cel.StringType, cel.DynType)
	stringList = cel.ListType(cel.StringType)

	ruleRolloutType = &ruleStruct{name: "trace.Rollout", fields: []ruleField{
		{"id", cel.StringType}, {"environment", cel.StringType}, {"task_id", cel.StringType},
		{"agent_name", cel.StringType}, {"agent_version", cel.StringType},
		// reward is a double; declared dyn, like the JSON numbers of
		// metadata, args and grader_breakdown, so that rollout.reward == 1
		// compares as a number (a double field == an int literal does not
		// type-check).
		{"success", cel.BoolType}, {"reward", cel.DynType},
		{"metadata", stringMap}, {"message_count", cel.IntType}, {"call_count", cel.IntType},
		{"tools", stringList}, {"grader_reasons", stringList}, {"grader_breakdown", stringMap},
	}}
	ruleMessageType = &ruleStruct{name: "trace.Message", fields: []ruleField{
		{"index", cel.IntType}, {"role", cel.StringType}, {"content", cel.StringType}, {"error", cel.BoolType},
		{"requestor", cel.StringType}, {"tool_call_id", cel.StringType}, {"tool_calls", stringList}, {"turn_idx", cel.IntType},
	}}
	ruleCallType = &ruleStruct{name: "trace.Call", fields: []ruleField{
		{"index", cel.IntType}, {"seq", cel.IntType}, {"id", cel.StringType}, {"name", cel.StringType},
		{"args", stringMap}, {"arg_values", stringList}, {"requestor", cel.StringType}, {"write", cel.BoolType},
		{"result", cel.StringType}, {"has_result", cel.BoolType}, {"result_index", cel.IntType}, {"error", cel.BoolType},
		{"prior", cel.StringType}, {"confirmed", cel.BoolType},
	}}
	ruleTypes = []*ruleStruct{ruleRolloutType, ruleMessageType, ruleCallType}
)

// celType is the object type to declare a variable with.
func (s *ruleStruct) celType() *types.Type { return types.NewObjectType(s.name) }

// HasTrait implements ref.Type.
func (s *ruleStruct) HasTrait(trait int) bool {
	return trait&(traits.FieldTesterType|traits.IndexerType) != 0
}

// TypeName implements ref.Type.
func (s *ruleStruct) TypeName() string { return s.name }

// ReflectType implements types.StructTypeDescriptor: no Go struct backs it.
func (s *ruleStruct) ReflectType() reflect.Type { return nil }

// FieldNames implements types.StructTypeDescriptor.
func (s *ruleStruct) FieldNames() []string {
	out := make([]string, len(s.fields))
	for i, f := range s.fields {
		out[i] = f.name
	}
	return out
}

// FindFieldType implements types.StructTypeDescriptor: the field is read
// from the map RuleVariables built.
func (s *ruleStruct) FindFieldType(name string) (*types.FieldType, bool) {
	for _, f := range s.fields {
		if f.name != name {
			continue
		}
		return &types.FieldType{
			Type: f.t,
			IsSet: func(target any) bool {
				m, ok := target.(map[string]any)
				if !ok {
					return false
				}
				_, ok = m[name]
				return ok
			},
			GetFrom: func(target any) (any, error) {
				m, ok := target.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("%s.%s: not a %s value: %T", s.name, name, s.name, target)
				}
				v, ok := m[name]
				if !ok {
					return nil, fmt.Errorf("no such key: %s", name)
				}
				return v, nil
			},
		}, true
	}
	return nil, false
}

// NewValue implements types.StructTypeDescriptor: detectors read rollouts,
// they do not build them.
func (s *ruleStruct) NewValue(types.Adapter, map[string]ref.Val) ref.Val {
	return types.NewErr("%s values cannot be constructed in a detector", s.name)
}

// Adapt implements types.StructTypeDescriptor.
func (s *ruleStruct) Adapt(a types.Adapter, value any) ref.Val { return a.NativeToValue(value) }
