package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/traceops/trace/internal/app"
	"github.com/traceops/trace/internal/config"
	"github.com/traceops/trace/internal/gcpace"
	"github.com/traceops/trace/internal/httpauth"
	"github.com/traceops/trace/synthesizer/envserver"
)

// envID is the environment id of a program file: its base name without
// the extension, with anything but letters, digits, '.', '_' and '-'
// replaced by '_'.
func envID(path string) string {
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	var b strings.Builder
	for _, r := range base {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "env"
	}
	return b.String()
}

func init() {
	var cf configFlags
	var ef envFlags
	cfg := envserver.DefaultConfig()
	var record bool
	cmd := &cobra.Command{
		Use:   "serve FILE...",
		Short: "Serve environment programs to RL trainers over OpenEnv (WebSocket, HTTP, MCP)",
		Long: `serve loads each environment program (Starlark, docs/environments.md) and
serves it over OpenEnv, the protocol of openenv-core's reference server that
TRL, verifiers and AgileRL consume unchanged. FILE's base name is the
environment's id; it is served under /v1/environments/ID/ (ws, reset, step,
state, schema, metadata, health, mcp, openapi.json), and GET /v1/environments
lists them.

FILE is a path, or example:NAME for a program shipped with trace.

  trace env serve example:precondition_airline
  # python: GenericEnvClient(base_url="http://127.0.0.1:8090/v1/environments/precondition_airline")

Programs run in a sandbox worker (memory, steps and time bounded) unless
--in-process. The token is --token, else env.bearer_token, else
http.bearer_token from the configuration (TRACE_ENV__BEARER_TOKEN,
TRACE_HTTP__BEARER_TOKEN), as for trace run's serve role; clients send it
as a bearer header, as the password in the URL (http://trace:TOKEN@host:port/...), which
openenv's WebSocket client passes on, or as ?token=. /health is open.
With --record, finished episodes are written to ClickHouse env_episodes
(the configured clickhouse.addr, or the embedded one of a running trace run).
/metrics serves the Prometheus metrics. SIGTERM drains: sessions get
SESSION_ERROR, queued episodes are written, then it exits 0.`,
		Example: `  trace env serve example:precondition_airline
  trace env serve --addr 0.0.0.0:8090 --token secret --record envs/*.star`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			app.SetMemoryLimit(slog.Default())
			ctx := cmd.Context()
			if err := ef.check(); err != nil {
				return err
			}
			tc, err := cf.load()
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("token") {
				// The serve role's rule (internal/app).
				cfg.BearerToken = cmp.Or(tc.Env.BearerToken, tc.HTTP.BearerToken)
			}
			// A setting is named as this command takes it: its flag, or
			// the configuration's key for those without one.
			name := func(key string) string {
				flag := strings.ReplaceAll(key, "_", "-")
				if key == "ws_origins" {
					flag = "ws-origin"
				}
				if cmd.Flags().Lookup(flag) != nil {
					return "--" + flag
				}
				return envserver.ConfigName(key)
			}
			if err := cfg.Check(name); err != nil {
				return err
			}
			if cfg.Addr == "" {
				return errors.New("--addr: a host:port to listen on is required")
			}
			// A serve-only process's collector target (env.gogc's rule).
			p, _ := (config.Config{Roles: []string{"serve"}, Env: cfg}).GCPolicy(os.Getenv("GOGC"))
			defer gcpace.Start(p)()
			cat := envserver.NewStaticCatalog()
			defer cat.Close() // the programs no session opened
			var ids []string
			for _, f := range files {
				name, src, err := readProgram(f)
				if err != nil {
					return err
				}
				env, err := ef.load(ctx, filepath.Base(name), src)
				if err != nil {
					return fmt.Errorf("%s: %w", f, err)
				}
				id := envID(name)
				if err := cat.Add(id, env, envserver.Entry{MaxTurns: ef.lim.MaxTurns}); err != nil {
					env.Close()
					return fmt.Errorf("%s: %w", f, err)
				}
				ids = append(ids, id)
			}
			reg := prometheus.NewRegistry()
			opts := envserver.Options{Catalog: cat, Registerer: reg, Log: slog.Default(), SettingName: name}
			if record {
				st, err := openStore(ctx, tc)
				if err != nil {
					return fmt.Errorf("--record: %w", err)
				}
				defer st.Close()
				opts.Writer = st
			}
			srv, err := envserver.New(cfg, opts)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", cfg.Addr)
			if err != nil {
				srv.Close(context.Background())
				return err
			}
			if httpauth.Exposed(ln.Addr(), cfg.BearerToken) {
				slog.Warn("env serve: listening beyond this machine without a token: anyone who can reach it plays the environments; set --token (or env.bearer_token)", "addr", ln.Addr().String())
			}
			mux := http.NewServeMux()
			mux.Handle("GET /metrics", envserver.Auth(cfg.BearerToken, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})))
			mux.Handle("/", srv.Handler())
			hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			out := cmd.OutOrStdout()
			base := "http://" + ln.Addr().String()
			for _, id := range ids {
				fmt.Fprintf(out, "serving %s at %s/v1/environments/%s\n", id, base, id)
			}
			fmt.Fprintf(out, "listening on %s (GET %s/v1/environments lists the environments)\n", ln.Addr(), base)
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			select {
			case err := <-errc:
				srv.Close(context.Background())
				return err
			case <-ctx.Done():
			}
			slog.Info("env serve: shutting down")
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			hs.Shutdown(sctx)
			// The sessions get a budget of their own (and the queued
			// episodes the recorder's, on top of it).
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer ccancel()
			return srv.Close(cctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "127.0.0.1:8090", "listen address (port 0 picks a free port)")
	f.StringVar(&cfg.BearerToken, "token", "", "token clients must send (default: env.bearer_token, else http.bearer_token of the configuration)")
	f.IntVar(&cfg.MaxSessions, "max-sessions", cfg.MaxSessions, "concurrent sessions per environment; one more is answered CAPACITY_REACHED")
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "evict a session idle for this long (SESSION_ERROR)")
	f.DurationVar(&cfg.StepTimeout, "step-timeout", cfg.StepTimeout, "bound of one reset or step (EXECUTION_ERROR past it)")
	f.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", cfg.MaxMessageBytes, "largest frame or body accepted (VALIDATION_ERROR above)")
	f.IntVar(&cfg.MaxObservationBytes, "max-observation-bytes", cfg.MaxObservationBytes, "largest observation sent (EXECUTION_ERROR instead, the episode over)")
	f.BoolVar(&record, "record", false, "record finished episodes in ClickHouse env_episodes")
	f.Float64Var(&cfg.RecordSample, "record-sample", cfg.RecordSample, "share of episodes recorded with --record (0 to 1)")
	f.StringSliceVar(&cfg.WSOrigins, "ws-origin", cfg.WSOrigins, "origin host pattern (such as *.example.com) whose browser pages may open a WebSocket, besides this server's host; repeatable, as env.ws_origins")
	f.IntVar(&cfg.GOGC, "gogc", cfg.GOGC, "the garbage collector's target, as env.gogc (0: Go's 100; GOGC in the environment wins)")
	cf.add(cmd)
	ef.add(cmd)
	envCmd.AddCommand(cmd)
}
