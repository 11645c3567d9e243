package dashboard

import (
	"fmt"
	"strings"

	"github.com/traceops/trace/sink"
)

// QueriesDocPath is docs/queries.md relative to the repository root.
const QueriesDocPath = "docs/queries.md"

// QueriesDoc renders docs/queries.md from sink.DashboardQueries. TestQueriesDoc checks
// that the file is up to date; TRACE_UPDATE_DOCS=1 go test -run
// TestQueriesDoc ./internal/dashboard/ rewrites it.
func QueriesDoc() string {
	var b strings.Builder
	b.WriteString(`# Failure-trend queries

<!-- Generated from sink/dashboard.go by internal/dashboard/docs.go.
     Do not edit by hand: TRACE_UPDATE_DOCS=1 go test -run TestQueriesDoc ./internal/dashboard/ -->

Ready-made ClickHouse SQL for failure-trend analytics: pass rate over time per
agent version, Cov and Δ over time per capability, and the capabilities most
often LACKING this week against last week. These are the statements the
dashboard itself runs (the constants in ` + "`sink/dashboard.go`" + `),
so the numbers you get match the dashboard's pages and its JSON API.

They run unchanged on ClickHouse 18.16 (Debian's package, used in CI) and on
current ClickHouse: no window functions, no DateTime64, no Map, no
toStartOfInterval, no server-side ` + "`{name:Type}`" + ` parameters. Buckets use
toStartOfHour, toStartOfDay and toMonday (weeks start on Monday in the
server's time zone). The hourly queries become daily ones (the dashboard's
` + "`bucket=day`" + `) by writing toStartOfDay where they bucket with
toStartOfHour (not in the filters on ` + "`toStartOfHour(ts)`" + `). The dashboard
starts a chart's range at the start of such a bucket in the server's time
zone (the one ClickHouse sends in its handshake), so on a server that is
not on UTC the first day is a whole day too.

## Conventions

- **One label per key.** A label's identity is (capability, run, rollout_id)
  within a cohort; redelivered or relabeled rows are collapsed with
  ` + "`argMax(label, ingest_ns)`" + `, the most recently ingested one, as the analyzer's
  window statistics do.
- **Statistics per run, then averaged** (TRACE-METHOD.md, step 1): per
  capability and labeling run, ER− = L−/(L−+P−), ER+ = L+/(L++P+),
  Δ = ER− − ER+, Cov = L−/|failed| (NA included in |failed|); a ratio whose
  denominator is 0 is 0. Charts show the mean over the runs.
- **Exact counts.** Pass rates read the ` + "`rollout_counts`" + ` aggregate with
  ` + "`uniqExactMerge`/`uniqExactIfMerge`" + `: a redelivered rollout counts once.
- **Rollup of closed hours, raw for the rest.** The trend statements read the
  hours an exact rollup has computed (` + "`label_hourly`, `labeled_hourly`, `rollout_hourly`" + `:
  counts per cohort, capability, run and hour, one label per identity) and
  every other hour — the open one, an hour that received late, redelivered or
  relabeled data since, a partial first hour — from the raw rows
  (` + "`labels_by_time`" + `, sorted by time within each cohort, and ` + "`rollout_counts`" + `).
  The rollup's watermark (` + "`rollup_watermark`" + `: the changes its last complete run
  covered and the first hour it left open) and the tail of ` + "`rollup_log`" + ` (the
  hours changed since, sorted by ingest time: normally a handful) say which
  hours are which, and a rollup row counts in its newest version (` + "`argMax(…, version)`" + `),
  so the numbers are always the raw computation's; ` + "`trace bench query`" + `
  compares them with the statements before the rollup.
- **Binds.** ` + "`?`" + ` are client-side binds (clickhouse-go replaces them in
  order); times are Unix seconds inside ` + "`toDateTime(?)`" + `. Each query below is
  followed by a ready-to-run copy with example values for clickhouse-client:

      clickhouse-client --database trace --query "$(cat query.sql)"

`)
	more := false
	for _, q := range sink.DashboardQueries {
		if q.More && !more {
			more = true
			b.WriteString("# Other statements of the dashboard\n\nThe rest of what the dashboard's pages and API read, for completeness.\n\n")
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\nGo constant: `sink.%s`.", q.Title, q.Purpose, q.Name)
		if len(q.Binds) == 0 {
			fmt.Fprintf(&b, " No binds. Ready to run:\n\n```sql\n%s\n```\n\n", q.SQL)
			continue
		}
		if q.Args == nil {
			b.WriteString(" Binds, in order:\n\n")
			for i, bd := range q.Binds {
				fmt.Fprintf(&b, "%d. %s — example `%s`\n", i+1, bd.Name, bd.Example)
			}
		} else {
			// The rollup's part and the raw part read the same range: some
			// values are bound twice. sink.Store.QueryDashboard takes the
			// values once and binds them so; a client of its own binds
			// every `?`, in this order.
			names := make([]string, len(q.Binds))
			for i, bd := range q.Binds {
				names[i] = bd.Name
			}
			fmt.Fprintf(&b, " Its %d `?` take, in order, these values, some twice (`sink.Store.QueryDashboard` takes each once: %s):\n\n", len(q.Args), strings.Join(names, ", "))
			for i, a := range q.Args {
				fmt.Fprintf(&b, "%d. %s — example `%s`\n", i+1, q.Binds[a].Name, q.Binds[a].Example)
			}
		}
		fmt.Fprintf(&b, "\n```sql\n%s\n```\n\nReady to run:\n\n", q.SQL)
		ex, err := q.Example()
		if err != nil {
			ex = "-- " + err.Error()
		}
		fmt.Fprintf(&b, "```sql\n%s\n```\n\n", ex)
	}
	return b.String()
}
