package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/sink"
)

// openStore connects to the configured ClickHouse, or to the embedded one of
// a running `trace run`.
func openStore(ctx context.Context, cfg config.Config) (*sink.Store, error) {
	c := cfg.ClickHouse
	c.Addr = cfg.ClickHouseAddr()
	st, err := sink.Open(ctx, c, slog.Default())
	if err != nil {
		if len(cfg.ClickHouse.Addr) == 0 {
			return nil, fmt.Errorf("%w\n(no clickhouse.addr configured: is `trace run` running with its embedded ClickHouse on %s?)", err, c.Addr[0])
		}
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// connectBus connects to the configured NATS, or the embedded one.
func connectBus(ctx context.Context, cfg config.Config) (*bus.Bus, error) {
	n := cfg.NATS
	n.URL = cfg.NATSURL()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := bus.Connect(cctx, n, "trace-cli")
	if err != nil && cfg.NATS.URL == "" {
		return nil, fmt.Errorf("%w\n(no nats.url configured: is `trace run` running with its embedded NATS on %s?)", err, n.URL)
	}
	return b, err
}
