package sink

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultStallWarning is Config.StallWarning's default.
const DefaultStallWarning = 10 * time.Second

// A server that accepts the connection but does not answer (hung, its
// disk full, a network path dropping packets) holds an INSERT until the
// context's deadline or the driver's read timeout (5 min), and nothing
// failed to log: only /readyz showed it. Every batch INSERT of a Store
// (every one that sends rows: PrepareBatch) goes through watchedConn,
// which times each call that waits on the server (PrepareBatch, a block's
// Flush, Send): one waiting longer than Config.StallWarning logs a warning
// naming the table and the rows the INSERT holds, again every 3 ×
// StallWarning while it stays stuck, and one line when it ends; the
// Store's metrics (RegisterMetrics) count it. An INSERT … SELECT run by
// Exec (migrations, the rollup, the benchmarks' loads) is not timed: a
// long one is the server working, not a stall.

// stallWatch times the calls of one Store.
type stallWatch struct {
	after, every time.Duration
	addr         string
	log          *slog.Logger
	stalled      *prometheus.GaugeVec   // table: inserts waiting longer than after now
	stalls       *prometheus.CounterVec // table: inserts that waited longer than after
}

func newStallWatch(cfg Config, log *slog.Logger) *stallWatch {
	after := cfg.StallWarning
	if after <= 0 {
		after = DefaultStallWarning
	}
	w := &stallWatch{
		after: after, every: 3 * after, addr: strings.Join(cfg.Addr, ","), log: log,
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "trace_clickhouse_inserts_stalled",
			Help: "INSERTs waiting on ClickHouse longer than clickhouse.stall_warning now, by table (alert when > 0)."}, []string{"table"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "trace_clickhouse_insert_stalls_total",
			Help: "INSERTs that waited on ClickHouse longer than clickhouse.stall_warning, by table."}, []string{"table"}),
	}
	// The streams' tables are exported from the start, at 0.
	for _, table := range []string{"rollouts", "capability_labels"} {
		w.stalled.WithLabelValues(table)
		w.stalls.WithLabelValues(table)
	}
	return w
}

// start times one call of an INSERT into table, which holds rows() rows;
// the returned function ends it with the call's error.
func (w *stallWatch) start(table, op string, rows func() int) (end func(error)) {
	t0 := time.Now()
	var (
		mu      sync.Mutex
		stopped bool
		fired   bool
		timer   *time.Timer
	)
	fire := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if !fired {
			fired = true
			w.stalled.WithLabelValues(table).Inc()
			w.stalls.WithLabelValues(table).Inc()
		}
		w.log.Warn("clickhouse: insert stalled: no answer from the server yet", "table", table, "rows", rows(),
			"waiting", time.Since(t0).Round(100*time.Millisecond), "op", op, "addr", w.addr)
		timer.Reset(w.every)
	}
	mu.Lock()
	timer = time.AfterFunc(w.after, fire)
	mu.Unlock()
	return func(err error) {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
		if !fired {
			return
		}
		w.stalled.WithLabelValues(table).Dec()
		waited := time.Since(t0).Round(time.Millisecond)
		if err != nil {
			w.log.Warn("clickhouse: stalled insert failed", "table", table, "rows", rows(), "waited", waited, "op", op, "err", err)
		} else {
			w.log.Info("clickhouse: stalled insert went on", "table", table, "rows", rows(), "waited", waited, "op", op)
		}
	}
}

// insertRe finds the table of an INSERT statement.
var insertRe = regexp.MustCompile(`(?is)^\s*INSERT\s+INTO\s+(?:TABLE\s+)?([A-Za-z0-9_.` + "`" + `"]+)`)

// insertTable is the table an INSERT writes to, "" when query is not an
// INSERT.
func insertTable(query string) string {
	m := insertRe.FindStringSubmatch(query)
	if m == nil {
		return ""
	}
	return strings.Trim(m[1], "`\"")
}

type pendingRowsKey struct{}

// withPendingRows tells the INSERT run under ctx how many rows its caller
// holds for it (a Batcher's batch; n is read when a warning is logged),
// for the stall warning of a PrepareBatch that waits before any row is
// appended.
func withPendingRows(ctx context.Context, n *atomic.Int64) context.Context {
	return context.WithValue(ctx, pendingRowsKey{}, n)
}

// pendingRows is what withPendingRows told ctx, 0 when nothing.
func pendingRows(ctx context.Context) int {
	if n, ok := ctx.Value(pendingRowsKey{}).(*atomic.Int64); ok {
		return int(n.Load())
	}
	return 0
}

// watchedConn is the Store's connection with its INSERTs timed.
type watchedConn struct {
	driver.Conn
	w *stallWatch
}

func (c *watchedConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	b := &watchedBatch{w: c.w, table: insertTable(query)}
	b.hint = pendingRows(ctx)
	end := c.w.start(b.table, "prepare", b.rows)
	inner, err := c.Conn.PrepareBatch(ctx, query, opts...)
	end(err)
	if err != nil {
		return nil, err
	}
	b.Batch = inner
	return b, nil
}

// watchedBatch is a batch whose calls that wait on the server are timed.
type watchedBatch struct {
	driver.Batch
	w        *stallWatch
	table    string
	hint     int
	appended atomic.Int64
}

// rows is what the INSERT holds: the rows appended so far, or what its
// caller said it holds, whichever is more.
func (b *watchedBatch) rows() int { return max(int(b.appended.Load()), b.hint) }

func (b *watchedBatch) Append(v ...any) error {
	err := b.Batch.Append(v...)
	if err == nil {
		b.appended.Add(1)
	}
	return err
}

func (b *watchedBatch) AppendStruct(v any) error {
	err := b.Batch.AppendStruct(v)
	if err == nil {
		b.appended.Add(1)
	}
	return err
}

func (b *watchedBatch) Flush() error {
	end := b.w.start(b.table, "flush", b.rows)
	err := b.Batch.Flush()
	end(err)
	return err
}

func (b *watchedBatch) Send() error {
	end := b.w.start(b.table, "send", b.rows)
	err := b.Batch.Send()
	end(err)
	return err
}

// RegisterMetrics registers the store's metrics on reg:
//
//	trace_clickhouse_inserts_stalled{table}     INSERTs waiting on the server longer than
//	                                            clickhouse.stall_warning now (alert when > 0)
//	trace_clickhouse_insert_stalls_total{table} INSERTs that waited that long
func (s *Store) RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{s.stall.stalled, s.stall.stalls} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
