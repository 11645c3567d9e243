package config

import (
	"cmp"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
)

// unknownKeys lists the keys of raw (the merged layers) that no field of
// t takes, as dotted paths ("kafka.brokerz"), with the keys known at that
// level. The decoder ignores such keys: a misspelled setting would
// silently keep its default. Keys match fields exactly, as the decoder
// matches them (decoderConfig): the koanf tag, squashed structs' fields at
// their parent's level. Every key is lower case; a key that matches one
// only in another case ("Kafka.brokers") is named with its right spelling.
func unknownKeys(raw map[string]any, t reflect.Type, prefix string) []string {
	return unknownKeysIn(raw, t, prefix, prefix)
}

// unknownKeysIn is unknownKeys where fixed is prefix spelled right (they
// differ under a key in the wrong case, whose every key is then reported).
func unknownKeysIn(raw map[string]any, t reflect.Type, prefix, fixed string) []string {
	fields := keyFields(t)
	var bad []string
	for key, v := range raw {
		i := slices.IndexFunc(fields, func(f keyField) bool { return f.name == key })
		if i < 0 {
			i = slices.IndexFunc(fields, func(f keyField) bool { return strings.EqualFold(f.name, key) })
		}
		if i < 0 {
			names := make([]string, len(fields))
			for j, f := range fields {
				names[j] = f.name
			}
			sort.Strings(names)
			where := "the top level"
			if prefix != "" {
				where = strings.TrimSuffix(prefix, ".")
			}
			bad = append(bad, fmt.Sprintf("%s%s: unknown key (%s has: %s)", prefix, key, where, strings.Join(names, ", ")))
			continue
		}
		path, fixedPath := prefix+key, fixed+fields[i].name
		var under []string // of the keys under this one
		eachSection(v, derefType(fields[i].typ), func(m map[string]any, st reflect.Type, at string) {
			under = append(under, unknownKeysIn(m, st, path+at+".", fixedPath+at+".")...)
		})
		bad = append(bad, under...)
		if path != fixedPath && len(under) == 0 {
			bad = append(bad, fmt.Sprintf("%s: unknown key; keys are lower case (%s)", path, fixedPath))
		}
	}
	sort.Strings(bad)
	return bad
}

// derefType is t without its pointers.
func derefType(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// eachSection calls fn for every section (a map of keys of a struct type)
// in v, the value of a setting of type t: v itself when t is a struct,
// each item when t is a map or a list of structs (a map's names are data,
// such as environments, not keys), in order, with at the path's suffix
// that leads to it: "", ".name" or "[j]".
func eachSection(v any, t reflect.Type, fn func(m map[string]any, st reflect.Type, at string)) {
	switch {
	case t.Kind() == reflect.Struct:
		if m, ok := v.(map[string]any); ok {
			fn(m, t, "")
		}
	case t.Kind() == reflect.Map && t.Elem().Kind() == reflect.Struct:
		if m, ok := v.(map[string]any); ok {
			for _, name := range slices.Sorted(maps.Keys(m)) {
				if im, ok := m[name].(map[string]any); ok {
					fn(im, t.Elem(), "."+name)
				}
			}
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		if items, ok := v.([]any); ok {
			for j, item := range items {
				if im, ok := item.(map[string]any); ok {
					fn(im, t.Elem(), fmt.Sprintf("[%d]", j))
				}
			}
		}
	}
}

type keyField struct {
	name string
	typ  reflect.Type
}

// keyFields are the keys a struct type takes.
func keyFields(t reflect.Type) []keyField {
	var fs []keyField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("koanf")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "squash") {
			fs = append(fs, keyFields(f.Type)...)
			continue
		}
		fs = append(fs, keyField{name: cmp.Or(name, f.Name), typ: f.Type})
	}
	return fs
}

// isList reports whether the dotted key names a list of strings, whose
// value in an environment variable or --set is comma-separated.
func isList(key string) bool {
	t := reflect.TypeFor[Config]()
	parts := strings.Split(key, ".")
	for _, p := range parts {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() == reflect.Map { // a map's key (adapter.plan.environments.<env>)
			t = t.Elem()
			continue
		}
		if t.Kind() != reflect.Struct {
			return false
		}
		fs := keyFields(t)
		j := slices.IndexFunc(fs, func(f keyField) bool { return strings.EqualFold(f.name, p) })
		if j < 0 {
			return false
		}
		t = fs[j].typ
	}
	return t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String
}

// splitList is the value of a list setting in an environment variable or
// --set: its items separated by commas, each trimmed of spaces. Empty
// items are left out, so that an empty value is the empty list
// (kafka.brokers= goes back to the embedded broker) and a trailing comma
// is no item; "[]", YAML's empty list, is the empty list too.
func splitList(v string) []string {
	items := []string{}
	if strings.TrimSpace(v) == "[]" {
		return items
	}
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" { // "a:1, b:2" as "a:1,b:2"
			items = append(items, item)
		}
	}
	return items
}
