// Package bench measures trace's ingest path end to end on this machine:
// Kafka (an embedded kfake broker on disk) → stream.Consumer (decode +
// validate) → ClickHouse, against the ClickHouse insert ceiling, a bare
// kafka-go consumer and the obvious single-goroutine loop. `trace bench
// ingest` runs it.
//
// The data are the τ²-bench simulations of shared/data/tau2, converted with
// ingest.ConvertTau2File and cloned with fresh rollout ids: "whole" rollouts
// as converted (~21-28 KB of JSON) and "compact" ones whose message contents
// were cut to 300 characters and tool-argument strings to 200 before
// publishing (~9 KB).
package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"github.com/traceops/trace/ingest"
	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/sink"
)

// Set names a data set.
type Set string

// The data sets.
const (
	Whole   Set = "whole"
	Compact Set = "compact"
)

// LoadTau2 converts every τ²-bench result file (*.json) in dir.
func LoadTau2(dir string) ([]*schemas.Rollout, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []*schemas.Rollout
	for _, f := range files {
		rs, err := ingest.ConvertTau2File(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, rs...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no τ²-bench rollouts in %s", dir)
	}
	return out, nil
}

// CompactRollout returns a copy of r whose message contents are cut to
// sink.MaxContentChars and whose tool-argument strings are cut to
// sink.MaxArgumentsChars: a rollout compacted by its producer. Arguments stay
// objects, as the schema requires.
func CompactRollout(r *schemas.Rollout) *schemas.Rollout {
	c := *r
	c.Messages = make([]schemas.Message, len(r.Messages))
	for i, m := range r.Messages {
		m.Content = sink.Truncate(m.Content, sink.MaxContentChars)
		if m.ToolCalls != nil {
			calls := make([]schemas.ToolCall, len(m.ToolCalls))
			for j, tc := range m.ToolCalls {
				tc.Arguments, _ = truncateStrings(tc.Arguments).(map[string]any)
				calls[j] = tc
			}
			m.ToolCalls = calls
		}
		c.Messages[i] = m
	}
	return &c
}

func truncateStrings(v any) any {
	switch x := v.(type) {
	case string:
		return sink.Truncate(x, sink.MaxArgumentsChars)
	case map[string]any:
		if x == nil {
			return x
		}
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = truncateStrings(e)
		}
		return m
	case []any:
		a := make([]any, len(x))
		for i, e := range x {
			a[i] = truncateStrings(e)
		}
		return a
	}
	return v
}

// idWidth is the width of generated rollout ids: "<8 run chars>-<set
// letter>-<9 digits>".
const idWidth = 8 + 1 + 1 + 1 + 9

var placeholder = bytes.Repeat([]byte{'#'}, idWidth)

// Dataset produces the Kafka messages and ClickHouse rows of one set: the
// templates are marshalled once and message i is template i%len with the
// rollout id "<run>-<set letter>-<i>" written in place, so a million
// messages cost no more memory than the templates.
type Dataset struct {
	Set      Set
	run      string
	values   []template // Kafka values
	keys     [][]byte
	rows     []template // JSONEachRow lines of the rollouts table
	avgBytes float64
}

type template struct {
	b  []byte
	at int // offset of the id placeholder
}

func newTemplate(b []byte, prefix string) (template, error) {
	i := bytes.Index(b, append([]byte(prefix), placeholder...))
	if i < 0 {
		return template{}, fmt.Errorf("bench: id placeholder not found")
	}
	return template{b: b, at: i + len(prefix)}, nil
}

// NewDataset builds the set from the converted τ² rollouts. run (8 chars)
// makes the ids of one bench run unique.
func NewDataset(set Set, rollouts []*schemas.Rollout, run string) (*Dataset, error) {
	if len(run) != 8 {
		return nil, fmt.Errorf("bench: run id %q must have 8 characters", run)
	}
	d := &Dataset{Set: set, run: run}
	var total int
	now := time.Now().UTC()
	for _, r := range rollouts {
		if set == Compact {
			r = CompactRollout(r)
		}
		c := *r
		c.RolloutID = string(placeholder)
		value, err := json.Marshal(&c)
		if err != nil {
			return nil, err
		}
		// Only valid rollouts; the row is what the ingest stage stores.
		dr, err := schemas.DecodeRawRollout(value, schemas.DecodeOptions{})
		if err != nil {
			return nil, fmt.Errorf("bench: template %s: %w", r.RolloutID, err)
		}
		t, err := newTemplate(value, `"rollout_id":"`)
		if err != nil {
			return nil, err
		}
		d.values = append(d.values, t)
		d.keys = append(d.keys, []byte(dr.Head.Key()))
		total += len(value)

		row := sink.RawRolloutRow(dr, sink.Coord{Topic: "bench", Partition: 0, Offset: 0})
		line, err := json.Marshal(rowJSON(row, now))
		if err != nil {
			return nil, err
		}
		rt, err := newTemplate(append(line, '\n'), `"rollout_id":"`)
		if err != nil {
			return nil, err
		}
		d.rows = append(d.rows, rt)
	}
	d.avgBytes = float64(total) / float64(len(d.values))
	return d, nil
}

// AvgBytes is the mean size of a Kafka value.
func (d *Dataset) AvgBytes() float64 { return d.avgBytes }

// Templates is the number of distinct rollouts the set clones.
func (d *Dataset) Templates() int { return len(d.values) }

func (d *Dataset) fill(t template, i int, dst []byte) []byte {
	dst = append(dst[:0], t.b...)
	id := fmt.Appendf(nil, "%s-%c-%09d", d.run, d.Set[0], i)
	copy(dst[t.at:t.at+idWidth], id)
	return dst
}

// Value is Kafka value i (a fresh copy in dst's storage).
func (d *Dataset) Value(i int, dst []byte) []byte { return d.fill(d.values[i%len(d.values)], i, dst) }

// Key is the Kafka key of message i: the rollout's cohort.
func (d *Dataset) Key(i int) []byte { return d.keys[i%len(d.keys)] }

// Row is the JSONEachRow line (with its newline) of row i of the rollouts
// table: the values RawRolloutRow gives for message i.
func (d *Dataset) Row(i int, dst []byte) []byte { return d.fill(d.rows[i%len(d.rows)], i, dst) }

// rowJSON maps a row to the columns of the rollouts table, as InsertRollouts
// writes them.
func rowJSON(r sink.RolloutRow, now time.Time) map[string]any {
	end := r.EndTime
	if end.IsZero() {
		end = now
	}
	start := r.StartTime
	if start.IsZero() {
		start = end
	}
	const dt = "2006-01-02 15:04:05"
	success := 0
	if r.Success {
		success = 1
	}
	return map[string]any{
		"rollout_id": string(placeholder), "environment": r.Environment, "agent_name": r.AgentName,
		"agent_version": r.AgentVersion, "task_id": r.TaskID, "success": success, "reward": r.Reward,
		"start_time": start.UTC().Format(dt), "end_time": end.UTC().Format(dt),
		"n_messages": r.NMessages, "n_tool_calls": r.NToolCalls, "n_tool_errors": r.NToolErrors,
		"messages": r.Messages, "tools": r.Tools, "grader": r.Grader, "metadata": r.Metadata,
		"kafka_topic": r.Coord.Topic, "kafka_partition": r.Coord.Partition, "kafka_offset": r.Coord.Offset,
		"ingested_at": now.Format(dt), "ingest_ns": now.UnixNano(),
	}
}
