package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/traceops/trace/sink"
)

// RSSResult is the outcome of RunRSS.
type RSSResult struct {
	Rollouts     int
	Bytes        int64
	Elapsed      time.Duration // from the first stored row to the last
	Total        time.Duration // from the start of `trace run` to the last stored row
	Produce      time.Duration // producing the backlog, before trace starts
	PeakRSSKB    int64         // VmHWM of the trace process
	MaxSampledKB int64         // highest VmRSS seen by the 250ms sampler
	StartRSSKB   int64         // VmRSS once it stored its first rows
	Command      string
	MemoryLimit  string // GOMEMLIMIT given to the process, if any
}

// RunRSS measures the memory of trace's ingest process as it runs in
// production: `trace run --roles ingest` (opt.Binary) in its own process,
// consuming opt.RSSRollouts compact rollouts from the bench's broker into
// the bench's ClickHouse. This process first generates and produces the
// whole backlog (only the 164 templates are held), so that trace then runs
// at full speed. It samples the child's
// /proc/PID/status and reports its peak resident memory (VmHWM); the
// broker and the producer are not in that process, as in production.
func RunRSS(ctx context.Context, opt Options) (RSSResult, error) {
	n := opt.RSSRollouts
	opt.Sets = []Set{}
	if opt.Binary == "" {
		return RSSResult{}, errors.New("bench: RunRSS needs Options.Binary (the trace executable)")
	}
	e, cleanup, err := setup(ctx, &opt)
	if err != nil {
		return RSSResult{}, err
	}
	defer cleanup()
	rollouts, err := LoadTau2(opt.Tau2Dir)
	if err != nil {
		return RSSResult{}, err
	}
	ds, err := NewDataset(Compact, rollouts, e.run)
	if err != nil {
		return RSSResult{}, err
	}
	db := "bench_" + e.run + "_rss"
	store, err := e.store(ctx, db)
	if err != nil {
		return RSSResult{}, err
	}
	defer store.Close()
	topic := "bench-" + e.run + "-rss"
	// Create the topic before the consumer joins.
	if err := e.createTopic(ctx, topic); err != nil {
		return RSSResult{}, err
	}

	args := []string{"run", "--roles", "ingest",
		"--set", "data_dir=" + filepath.Join(e.dir, "trace-run"),
		"--set", "kafka.brokers=" + strings.Join(e.brokers, ","),
		"--set", "kafka.rollouts_topic=" + topic,
		"--set", "kafka.dlq_topic=" + topic + ".dlq",
		"--set", "kafka.ingest_group=bench-rss-" + e.run,
		"--set", "clickhouse.addr=" + e.chAddr,
		"--set", "clickhouse.database=" + db,
		"--set", "http.addr=127.0.0.1:0",
	}
	if opt.CHCompression != "" {
		args = append(args, "--set", "clickhouse.compression="+opt.CHCompression)
	}
	c := opt.Consumer
	if c.BatchRows > 0 {
		args = append(args, "--set", "kafka.batch_rows="+strconv.Itoa(c.BatchRows))
	}
	if c.BatchBytes > 0 {
		args = append(args, "--set", "kafka.batch_bytes="+strconv.Itoa(c.BatchBytes))
	}
	if c.BatchTimeout > 0 {
		args = append(args, "--set", "kafka.batch_timeout="+c.BatchTimeout.String())
	}
	res := RSSResult{Rollouts: n, Command: "trace " + strings.Join(args, " "), MemoryLimit: opt.ChildMemoryLimit}
	// The whole backlog is in the topic first, so that trace consumes at
	// full speed (and the producer takes no CPU from it).
	e.log.Info("producing", "rollouts", n, "topic", topic)
	t0 := time.Now()
	if res.Bytes, err = e.produce(ctx, topic, ds, n); err != nil {
		return res, err
	}
	res.Produce = time.Since(t0)
	e.log.Info("produced", "rollouts", n, "MB", res.Bytes/1e6, "took", res.Produce.Round(time.Millisecond))
	logPath := filepath.Join(e.dir, "trace-run.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	cmd := exec.Command(opt.Binary, args...)
	// The child's configuration is exactly the flags above.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TRACE_") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if opt.ChildMemoryLimit != "" {
		cmd.Env = append(cmd.Env, "GOMEMLIMIT="+opt.ChildMemoryLimit)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	t0 = time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("bench: start %s: %w", opt.Binary, err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	fail := func(err error) (RSSResult, error) {
		return res, fmt.Errorf("%w (trace run log: %s)", err, tail(logPath, 2000))
	}

	var first time.Time
	tick := time.NewTicker(rssSampleEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-exited:
			stopped = true
			return fail(fmt.Errorf("bench: trace run exited early: %v", err))
		case <-tick.C:
		}
		if v := ProcStatusKB(pid, "VmRSS"); v > res.MaxSampledKB {
			res.MaxSampledKB = v
		}
		if i%rssCountEvery != 0 {
			continue
		}
		got, err := store.CountRollouts(ctx)
		if err != nil {
			if sink.IsRetryable(err) {
				continue
			}
			return fail(err)
		}
		if got > 0 && first.IsZero() {
			first = time.Now()
			res.StartRSSKB = ProcStatusKB(pid, "VmRSS")
		}
		if got >= uint64(n) {
			break
		}
	}
	now := time.Now()
	res.Elapsed, res.Total = now.Sub(first), now.Sub(t0)
	res.PeakRSSKB = ProcStatusKB(pid, "VmHWM")
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			return fail(fmt.Errorf("bench: trace run did not exit cleanly on SIGTERM: %v", err))
		}
	case <-time.After(15 * time.Second):
		return fail(errors.New("bench: trace run did not exit within 15s of SIGTERM"))
	}
	e.log.Info("rss run done", "rollouts", n, "elapsed", res.Elapsed.Round(time.Millisecond), "peak_rss_MB", res.PeakRSSKB>>10)
	return res, e.checkCount(ctx, db, n)
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}

// The RSS run samples the process's RSS every rssSampleEvery and counts
// the stored rows every rssCountEvery samples (once a second).
const (
	rssSampleEvery = 250 * time.Millisecond
	rssCountEvery  = 4
)

// String formats the result.
func (r RSSResult) String() string {
	s := fmt.Sprintf("%s\n", r.Command)
	if r.MemoryLimit != "" {
		s += fmt.Sprintf("with GOMEMLIMIT=%s\n", r.MemoryLimit)
	}
	// A backlog stored between two counts of the rows has no rate to show.
	rate := fmt.Sprintf("%.0f rollouts/s", float64(r.Rollouts)/r.Elapsed.Seconds())
	if every := rssSampleEvery * rssCountEvery; r.Elapsed < every {
		rate = fmt.Sprintf("no rate: all were stored by the first count, and rows are counted every %v", every)
	}
	s += fmt.Sprintf("backlog of %d compact rollouts (%.0f MB) produced in %v; then trace stored them in %v from its first stored row: %s (%v from process start)\n",
		r.Rollouts, float64(r.Bytes)/1e6, r.Produce.Round(time.Second), r.Elapsed.Round(time.Millisecond), rate, r.Total.Round(time.Millisecond))
	s += fmt.Sprintf("peak RSS (VmHWM) of the trace process: %d MB  (RSS once streaming %d MB, highest 250ms sample %d MB)\n",
		r.PeakRSSKB>>10, r.StartRSSKB>>10, r.MaxSampledKB>>10)
	return s
}
