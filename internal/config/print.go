package config

import (
	"time"

	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
)

// Map renders c as nested maps keyed like the YAML file, with durations as
// strings ("1s"), for printing. It is derived from the struct tags, so every
// field appears.
func (c Config) Map() (map[string]any, error) {
	k := koanf.New(".")
	if err := k.Load(structs.Provider(c, "koanf"), nil); err != nil {
		return nil, err
	}
	m := durationsAsText(k.Raw())
	// No limit is -1, as it is written (not -1ns).
	if ch, ok := m["clickhouse"].(map[string]any); ok && c.ClickHouse.QueryTimeout < 0 {
		ch["query_timeout"] = -1
	}
	return m, nil
}

func durationsAsText(m map[string]any) map[string]any {
	for key, v := range m {
		switch x := v.(type) {
		case time.Duration:
			m[key] = x.String()
		case map[string]any:
			m[key] = durationsAsText(x)
		}
	}
	return m
}
