package chserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Restart backoff of Supervise: the first restart is attempted
// RestartInitial after the crash, then doubling (jittered by ±25 %) up to
// RestartMax between attempts, forever.
const (
	RestartInitial = 500 * time.Millisecond
	RestartMax     = 30 * time.Second
)

// SuperviseOptions tune Supervise. The zero value is usable.
type SuperviseOptions struct {
	// Initial and Max bound the restart backoff; zero means RestartInitial
	// and RestartMax.
	Initial, Max time.Duration
	// OnExit is called when the server exited without being asked to, with
	// its exit status (an *exec.ExitError, "signal: killed" for kill -9, or
	// nil for a clean exit). OnRestart is called after every successful
	// restart. Both are optional and called from Supervise's goroutine.
	OnExit    func(status error)
	OnRestart func()
}

// Supervise watches the server until ctx ends and restarts it whenever its
// process exits without Stop, Kill or Restart having asked it to (a crash,
// the OOM killer, a kill -9 by an operator). Each such exit is logged as an
// error with the process's exit status and the server's log file; restarts
// are attempted with capped exponential backoff (cenkalti/backoff/v4) on the
// same directory and ports, so the data and the address stay the same,
// until one succeeds. While the server is down, Healthy returns an error
// saying so.
//
// Supervise returns nil when ctx ends; it leaves the server as it is then
// (running or not): Stop it afterwards. An exit that Stop or Kill asked for
// is not restarted; Supervise then waits for the server to be started again
// (Restart) and goes on watching it.
func (s *Server) Supervise(ctx context.Context, o SuperviseOptions) error {
	if o.Initial <= 0 {
		o.Initial = RestartInitial
	}
	if o.Max <= 0 {
		o.Max = RestartMax
	}
	for {
		p := s.current()
		if p == nil {
			// Stopped on purpose: look again later (Restart may start it).
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.done:
		}
		at := time.Now()
		s.mu.Lock()
		crashed := !p.stopping.Load() && s.proc.Load() == p
		if crashed {
			// Down before forgotten: see Healthy.
			s.setDown(fmt.Errorf("local ClickHouse server (pid %d) exited unexpectedly at %s (%s); restarting",
				p.pid, at.UTC().Format(time.RFC3339), exitStatus(p.err)))
			s.forget(p)
		}
		s.mu.Unlock()
		if !crashed {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		s.crashed(ctx, p, o, at)
	}
}

// crashed logs the unexpected exit of p at at (recorded by the caller),
// then restarts the server with backoff until it runs again or ctx ends.
func (s *Server) crashed(ctx context.Context, p *process, o SuperviseOptions, at time.Time) {
	status := exitStatus(p.err)
	s.log.Error("clickhouse: local server exited unexpectedly; restarting it",
		"pid", p.pid, "status", status, "dir", s.dir, "log", s.LogFile())
	if o.OnExit != nil {
		o.OnExit(p.err)
	}
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(o.Initial),
		backoff.WithMaxInterval(o.Max),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.25),
		backoff.WithMaxElapsedTime(0),
	)
	for attempt := 1; ; attempt++ {
		wait := min(bo.NextBackOff(), o.Max)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		err := s.restartCrashed(ctx)
		if err == nil {
			s.setDown(nil)
			s.log.Warn("clickhouse: restarted the local server after it exited",
				"pid", s.Pid(), "attempt", attempt, "down_for", time.Since(at).Round(time.Millisecond), "addr", s.Addr())
			if o.OnRestart != nil {
				o.OnRestart()
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.setDown(fmt.Errorf("local ClickHouse server down since %s (%s); restart attempt %d failed: %w",
			at.UTC().Format(time.RFC3339), status, attempt, err))
		s.log.Error("clickhouse: restarting the local server failed; retrying",
			"attempt", attempt, "error", err, "retry_in", min(bo.NextBackOff(), o.Max))
	}
}

// restartCrashed starts the server again unless something else (Restart)
// already did.
func (s *Server) restartCrashed(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc.Load() != nil {
		return nil
	}
	return s.startLocked(ctx, s.version)
}

// current is the running process, or nil.
func (s *Server) current() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc.Load()
}

// Healthy returns nil unless the server exited without being asked to
// and has not been restarted yet; the error says why, and since when once
// Supervise has seen the exit. It never blocks on a start in progress.
func (s *Server) Healthy() error {
	// The process first: Supervise records the exit before it forgets
	// the process, so one of the two says so, also in the instant between
	// the process being reaped and Supervise seeing it.
	p := s.proc.Load()
	s.downMu.Lock()
	down := s.down
	s.downMu.Unlock()
	if down != nil {
		return down
	}
	if p != nil && !p.stopping.Load() && s.exited(p) {
		return fmt.Errorf("local ClickHouse server (pid %d) exited unexpectedly (%s)", p.pid, exitStatus(p.err))
	}
	return nil
}

func (s *Server) setDown(err error) {
	s.downMu.Lock()
	s.down = err
	s.downMu.Unlock()
}

// exitStatus describes how a process ended, from exec.Cmd.Wait's error.
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee interface{ ExitCode() int }
	if errors.As(err, &ee) {
		return err.Error()
	}
	return "wait: " + err.Error()
}
