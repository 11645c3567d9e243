package sink

import (
	"context"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// dashboardCtx is ctx with the dashboard's query limits as ClickHouse
// settings: max_execution_time (the server stops the query and answers
// TIMEOUT_EXCEEDED) and max_memory_usage (MEMORY_LIMIT_EXCEEDED). When ctx
// itself ends first, clickhouse-go cancels the query on the server.
func (s *Store) dashboardCtx(ctx context.Context) context.Context {
	set := clickhouse.Settings{}
	if t := s.cfg.QueryTimeout; t > 0 {
		set["max_execution_time"] = int(math.Ceil(t.Seconds()))
	}
	if m := s.cfg.QueryMaxMemory; m > 0 {
		set["max_memory_usage"] = int(m)
	}
	if len(set) == 0 {
		return ctx
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(set))
}

// QueryLimits are the limits dashboard queries run under (0 = none).
func (s *Store) QueryLimits() (timeout time.Duration, maxMemory int64) {
	return max(s.cfg.QueryTimeout, 0), max(s.cfg.QueryMaxMemory, 0)
}

// LimitKind classifies an error of a dashboard query: "timeout" when the
// server or the context stopped it for time, "memory" when the server
// refused it for memory, "" otherwise.
func LimitKind(err error) string {
	if err == nil {
		return ""
	}
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		switch ex.Code {
		case 159, 160: // TIMEOUT_EXCEEDED, TOO_SLOW
			return "timeout"
		case 241: // MEMORY_LIMIT_EXCEEDED
			return "memory"
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "TIMEOUT_EXCEEDED"), strings.Contains(msg, "Timeout exceeded"), strings.Contains(msg, "i/o timeout"):
		return "timeout"
	case strings.Contains(msg, "MEMORY_LIMIT_EXCEEDED"), strings.Contains(msg, "Memory limit"):
		return "memory"
	}
	return ""
}
