package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/traceops/trace/internal/httpauth"
)

// DefaultReadyTimeout bounds each /readyz check when http.ready_timeout is
// not set.
const DefaultReadyTimeout = 2 * time.Second

// ReadyCheck is one dependency check of /readyz.
type ReadyCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Millis int64  `json:"ms"`
}

// ReadyReport is the JSON body of /readyz: HTTP 200 when every check
// passed, 503 otherwise.
type ReadyReport struct {
	Status string       `json:"status"` // "ready" or "not ready"
	Checks []ReadyCheck `json:"checks"`
}

type readyProbe struct {
	name string
	fn   func(ctx context.Context) error
}

// probes are the checks of this process's dependencies, in report order:
// the roles started; ClickHouse answers a ping (and, when trace runs it,
// the local server is up and not being restarted by its supervisor); NATS
// is connected and answers a flush (analyze and serve roles only); a Kafka
// broker accepts a connection (ingest and analyze roles only).
func (a *App) probes() []readyProbe {
	ps := []readyProbe{{"roles", func(context.Context) error {
		select {
		case <-a.readyCh:
			return nil
		default:
			return errors.New("starting")
		}
	}}}
	if a.ch != nil {
		ps = append(ps, readyProbe{"clickhouse_server", func(context.Context) error {
			// Pid first: a server found gone has its reason in Healthy.
			pid := a.ch.Pid()
			if err := a.ch.Healthy(); err != nil {
				return err
			}
			if pid == 0 {
				return errors.New("the local ClickHouse server is not running")
			}
			return nil
		}})
	}
	ps = append(ps, readyProbe{"clickhouse", func(ctx context.Context) error { return a.Store.Ping(ctx) }})
	if a.Bus != nil {
		ps = append(ps, readyProbe{"nats", func(ctx context.Context) error {
			if !a.Bus.NC.IsConnected() {
				return fmt.Errorf("not connected (%s)", a.Bus.NC.Status())
			}
			return a.Bus.NC.FlushWithContext(ctx)
		}})
	}
	if a.Cfg.Has("ingest") || a.Cfg.Has("analyze") {
		ps = append(ps, readyProbe{"kafka", a.pingKafka})
	}
	// Each consumer that makes no progress (its sink failing, e.g. a full
	// disk while ClickHouse still answers pings; its topic missing).
	a.consumersMu.Lock()
	for _, c := range a.consumers {
		ps = append(ps, readyProbe{"consumer_" + c.Config().Stage, func(context.Context) error { return c.Problem() }})
	}
	a.consumersMu.Unlock()
	return ps
}

// pingKafka connects to the first broker that answers (with the configured
// TLS and SASL).
func (a *App) pingKafka(ctx context.Context) error {
	d := a.Dialer
	if d == nil {
		d = kafka.DefaultDialer
	}
	var errs []error
	for _, b := range a.Brokers {
		c, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			return c.Close()
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return errors.New("no broker configured")
	}
	return errors.Join(errs...)
}

// Readiness runs every check in parallel, each bounded by http.ready_timeout
// (a check that does not return in time counts as failed; it is left to
// finish in the background), and reports them.
func (a *App) Readiness(ctx context.Context) ReadyReport {
	timeout := a.Cfg.HTTP.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	ps := a.probes()
	rep := ReadyReport{Status: "ready", Checks: make([]ReadyCheck, len(ps))}
	done := make(chan int, len(ps))
	for i, p := range ps {
		rep.Checks[i].Name = p.name
		go func() {
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			res := make(chan error, 1)
			go func() { res <- p.fn(cctx) }()
			var err error
			select {
			case err = <-res:
				// A driver may report its own read timeout at the deadline,
				// an instant before the context says so.
				var ne net.Error
				if err != nil && (errors.Is(cctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() || time.Since(start) >= timeout) {
					err = fmt.Errorf("no answer within %s: %w", timeout, err)
				}
			case <-cctx.Done():
				err = fmt.Errorf("no answer within %s", timeout)
			}
			rep.Checks[i].OK, rep.Checks[i].Millis = err == nil, time.Since(start).Milliseconds()
			if err != nil {
				rep.Checks[i].Error = err.Error()
			}
			done <- i
		}()
	}
	for range ps {
		<-done
	}
	for _, c := range rep.Checks {
		if !c.OK {
			rep.Status = "not ready"
		}
	}
	return rep
}

// sharedReadiness is Readiness shared by the probes that arrive while a
// round of checks runs: they wait for it instead of starting their own, so
// at most one round runs at a time however often /readyz is hit (several
// load balancers, a hammering client). The round runs detached from the
// request that started it (bounded by http.ready_timeout), so a probe that
// gives up does not hand the others a report of cancelled checks.
func (a *App) sharedReadiness(ctx context.Context) ReadyReport {
	v, _, _ := a.readyRound.Do("readyz", func() (any, error) {
		return a.Readiness(context.WithoutCancel(ctx)), nil
	})
	return v.(ReadyReport)
}

// redacted is the report without the checks' errors, for a probe without
// the bearer token: an error can name internal hosts, users and
// databases. The status code, each check's name and result are kept
// (what a load balancer or Kubernetes probe needs; it sends no token).
func (rep ReadyReport) redacted() ReadyReport {
	out := ReadyReport{Status: rep.Status, Checks: make([]ReadyCheck, len(rep.Checks))}
	for i, c := range rep.Checks {
		c.Error = ""
		out.Checks[i] = c
	}
	return out
}

func (a *App) readyz(w http.ResponseWriter, r *http.Request) {
	rep := a.sharedReadiness(r.Context())
	if t := a.Cfg.HTTP.BearerToken; t != "" && !httpauth.Match(t, httpauth.Bearer(r.Header.Get("Authorization")), r.URL.Query().Get("token")) {
		rep = rep.redacted()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if rep.Status != "ready" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
}
