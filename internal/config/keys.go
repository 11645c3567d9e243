package config

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
)

// unknownKeys lists the keys of raw (the merged layers) that no field of
// t takes, as dotted paths ("kafka.brokerz"), with the keys known at that
// level. The decoder ignores such keys: a misspelled setting would
// silently keep its default. Keys match fields as the decoder matches
// them: the koanf tag (the field name without one), case-insensitively,
// squashed structs' fields at their parent's level.
func unknownKeys(raw map[string]any, t reflect.Type, prefix string) []string {
	fields := keyFields(t)
	var bad []string
	for key, v := range raw {
		i := slices.IndexFunc(fields, func(f keyField) bool { return strings.EqualFold(f.name, key) })
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
		ft := fields[i].typ
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct:
			if m, ok := v.(map[string]any); ok {
				bad = append(bad, unknownKeys(m, ft, prefix+key+".")...)
			}
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			if m, ok := v.(map[string]any); ok {
				for name, item := range m {
					if im, ok := item.(map[string]any); ok {
						bad = append(bad, unknownKeys(im, ft.Elem(), prefix+key+"."+name+".")...)
					}
				}
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			if items, ok := v.([]any); ok {
				for j, item := range items {
					if m, ok := item.(map[string]any); ok {
						bad = append(bad, unknownKeys(m, ft.Elem(), fmt.Sprintf("%s%s[%d].", prefix, key, j))...)
					}
				}
			}
		}
	}
	sort.Strings(bad)
	return bad
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
