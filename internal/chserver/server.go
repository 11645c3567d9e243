// Package chserver runs a local ClickHouse server as a child process: for
// `trace run` when no ClickHouse address is configured, and for tests.
//
// Start writes a config.xml and users.xml for the installed ClickHouse
// version into a directory that holds everything of the server (data, logs,
// temporary files), starts the server in its own process group, and waits
// until it answers. Data persists in that directory across Stop/Kill and
// Restart, and across processes.
//
// The server listens on 127.0.0.1 only and has a "default" user without a
// password.
package chserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Timeouts. ReadyTimeout bounds how long Start and Restart wait for /ping;
// StopTimeout is how long Stop waits after SIGTERM when its ctx has no
// deadline.
const (
	ReadyTimeout = 30 * time.Second
	StopTimeout  = 30 * time.Second
)

// Options configure Start.
type Options struct {
	// Dir holds the config files, data, temporary files and logs. It is
	// created if missing. Reusing a Dir keeps its data.
	Dir string
	// TCPPort (native protocol) and HTTPPort; 0 picks a free port.
	TCPPort, HTTPPort int
	// Logger receives one line per start and stop, and warnings; nil means
	// slog.Default().
	Logger *slog.Logger
	// Binary to run; the zero Binary means Find().
	Binary Binary
}

// Server is a running (or stopped) local ClickHouse server. Its methods are
// safe for concurrent use; lifecycle calls (Stop, Kill, Restart) run one at
// a time.
type Server struct {
	dir      string
	bin      Binary
	log      *slog.Logger
	tcpPort  int
	httpPort int

	mu sync.Mutex // serialises lifecycle operations and guards below
	// proc is the server's process, or nil. Written with mu held, read
	// without it only by Healthy, which must not wait for a start in
	// progress.
	proc        atomic.Pointer[process]
	version     Version // what the running (or last) server reported
	renderedFor Version // version the config on disk was rendered for

	downMu sync.Mutex
	down   error // set by Supervise while a crashed server is not back
}

type process struct {
	pid  int
	done chan struct{} // closed when the process has exited and was reaped
	err  error         // exit status, valid after done
	// stopping is set (under Server.mu) before Stop, Kill or Restart
	// signal the process: its exit is asked for, not a crash. Healthy
	// reads it without the lock.
	stopping atomic.Bool
}

// ours holds the pids of servers this process started and has not seen
// exit: Start refuses a Dir one of them is using instead of killing it.
var ours sync.Map // pid -> dir

// Start starts a ClickHouse server in o.Dir and waits until it answers
// /ping on its HTTP port (at most ReadyTimeout, less if ctx ends sooner).
//
// A server still running on the same Dir from an earlier process (one that
// crashed or was killed) is killed first; a server started by this process
// is not, and Start fails instead. ClickHouse's own lock and status files
// left by a killed server do not stop a start.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Dir == "" {
		return nil, errors.New("chserver: Options.Dir is empty")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("chserver: %w", err)
	}
	bin := o.Binary
	if bin.Path == "" {
		if bin, err = Find(); err != nil {
			return nil, err
		}
	}
	s := &Server{dir: dir, bin: bin, log: o.Logger, tcpPort: o.TCPPort, httpPort: o.HTTPPort}
	if s.log == nil {
		s.log = slog.Default()
	}
	for _, sub := range []string{dataSubdir, tmpSubdir, userFilesSubdir, formatSubdir, logSubdir} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("chserver: %w", err)
		}
	}
	// A guess to render the first config with; the running server's own
	// answer is checked below.
	guess, source, err := bin.DetectVersion(ctx)
	if err != nil {
		s.log.Debug("clickhouse: version unknown before start; rendering a config for any version", "err", err)
	} else {
		s.log.Debug("clickhouse: detected version", "version", guess, "from", source)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	autoPorts := o.TCPPort == 0 || o.HTTPPort == 0
	const attempts = 3
	for attempt := 1; ; attempt++ {
		if autoPorts {
			if s.tcpPort, s.httpPort, err = pickPorts(o.TCPPort, o.HTTPPort); err != nil {
				return nil, err
			}
		}
		err = s.startLocked(ctx, guess)
		if err == nil {
			break
		}
		// Another process can take a picked port between picking and
		// binding; pick again.
		var busy *portBusyError
		if autoPorts && attempt < attempts && errors.As(err, &busy) && ctx.Err() == nil {
			s.log.Debug("clickhouse: port taken, picking others", "err", err)
			continue
		}
		return nil, err
	}
	// The real version may need another config (when the guess failed, or
	// a clickhouse-client of another version answered it).
	if configKey(s.version) != configKey(s.renderedFor) {
		s.log.Info("clickhouse: restarting with a config for the version the server reported",
			"guessed", s.renderedFor, "actual", s.version)
		s.stopLocked(ctx)
		if err := s.startLocked(ctx, s.version); err != nil {
			return nil, err
		}
	}
	s.log.Info("clickhouse: started local server",
		"version", s.version, "addr", s.Addr(), "http", s.HTTPAddr(), "dir", dir,
		"binary", bin.String(), "pid", s.proc.Load().pid)
	return s, nil
}

// configKey is what of the rendered config depends on the version.
func configKey(v Version) string {
	return rootElement(v) + fmt.Sprint(ProfileSettings(v))
}

// Addr is the native protocol address, "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort(DefaultListenHost, strconv.Itoa(s.tcpPort)) }

// HTTPAddr is the HTTP interface address, "127.0.0.1:port".
func (s *Server) HTTPAddr() string {
	return net.JoinHostPort(DefaultListenHost, strconv.Itoa(s.httpPort))
}

// TCPPort and HTTPPort are the ports the server listens on; they stay the
// same across Restart.
func (s *Server) TCPPort() int  { return s.tcpPort }
func (s *Server) HTTPPort() int { return s.httpPort }

// Dir is the absolute directory of the server.
func (s *Server) Dir() string { return s.dir }

// Binary is the executable that runs the server.
func (s *Server) Binary() Binary { return s.bin }

// LogFile is the path of the server's main log file.
func (s *Server) LogFile() string { return filepath.Join(s.dir, logSubdir, serverLogFile) }

// Version is the version the server reported, e.g. "18.16.1".
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version.String()
}

// ParsedVersion is Version as numbers, for feature checks.
func (s *Server) ParsedVersion() Version {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Pid of the running server, or 0 when it is not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc.Load()
	if p == nil || s.exited(p) {
		return 0
	}
	return p.pid
}

// Stop sends SIGTERM to the server's process group and waits for it to
// exit; when ctx ends first (or after StopTimeout if ctx has no deadline)
// it sends SIGKILL. Stopping a stopped server is a no-op.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(ctx)
}

// Kill sends SIGKILL to the server's process group at once and waits until
// the process is gone: a crash, for fault tests. Data that ClickHouse has
// acknowledged is on disk and is there again after Restart.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc.Load()
	if p == nil {
		return nil
	}
	p.stopping.Store(true)
	err := signalGroup(p.pid, syscall.SIGKILL)
	<-p.done
	s.forget(p)
	if err != nil {
		return fmt.Errorf("chserver: kill pid %d: %w", p.pid, err)
	}
	s.log.Info("clickhouse: killed local server", "dir", s.dir, "pid", p.pid)
	return nil
}

// Restart stops the server if it is running (as Stop does) and starts it
// again on the same Dir and ports, so its data is still there.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(ctx); err != nil {
		return err
	}
	if err := s.startLocked(ctx, s.version); err != nil {
		return err
	}
	s.log.Info("clickhouse: restarted local server", "version", s.version, "addr", s.Addr(), "dir", s.dir, "pid", s.proc.Load().pid)
	return nil
}

func (s *Server) params(v Version) ConfigParams {
	return ConfigParams{Dir: s.dir, TCPPort: s.tcpPort, HTTPPort: s.httpPort, Version: v}
}

func (s *Server) configPath() string { return filepath.Join(s.dir, ConfigFile) }

func (s *Server) exited(p *process) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (s *Server) forget(p *process) {
	ours.Delete(p.pid)
	s.proc.CompareAndSwap(p, nil)
	if b, err := os.ReadFile(filepath.Join(s.dir, pidFile)); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(p.pid) {
		os.Remove(filepath.Join(s.dir, pidFile))
	}
}

func (s *Server) stopLocked(ctx context.Context) error {
	p := s.proc.Load()
	if p == nil {
		return nil
	}
	if s.exited(p) {
		s.forget(p)
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, StopTimeout)
		defer cancel()
	}
	p.stopping.Store(true)
	if err := signalGroup(p.pid, syscall.SIGTERM); err != nil {
		s.log.Warn("clickhouse: SIGTERM failed", "pid", p.pid, "err", err)
	}
	select {
	case <-p.done:
		s.log.Info("clickhouse: stopped local server", "dir", s.dir, "pid", p.pid)
	case <-ctx.Done():
		s.log.Warn("clickhouse: server did not stop in time; killing it", "dir", s.dir, "pid", p.pid)
		_ = signalGroup(p.pid, syscall.SIGKILL)
		<-p.done
	}
	s.forget(p)
	return nil
}

// signalGroup signals the process group led by pid (the server and any
// helper it started), and pid itself should it have left the group.
func signalGroup(pid int, sig syscall.Signal) error {
	gerr := syscall.Kill(-pid, sig)
	perr := syscall.Kill(pid, sig)
	if gerr == nil || perr == nil || errors.Is(perr, syscall.ESRCH) {
		return nil
	}
	return perr
}

// portBusyError means a port was taken when the server was about to start.
type portBusyError struct {
	port int
	err  error
}

func (e *portBusyError) Error() string {
	return fmt.Sprintf("chserver: port %d on %s is already in use: %v", e.port, DefaultListenHost, e.err)
}

// pickPorts returns free ports for the zero ones among tcp and http.
func pickPorts(tcp, http int) (int, int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	pick := func(p int) (int, error) {
		if p != 0 {
			return p, nil
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(DefaultListenHost, "0"))
		if err != nil {
			return 0, fmt.Errorf("chserver: pick a free port: %w", err)
		}
		lns = append(lns, ln)
		return ln.Addr().(*net.TCPAddr).Port, nil
	}
	t, err := pick(tcp)
	if err != nil {
		return 0, 0, err
	}
	h, err := pick(http)
	if err != nil {
		return 0, 0, err
	}
	return t, h, nil
}

func checkPortFree(port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(DefaultListenHost, strconv.Itoa(port)))
	if err != nil {
		return &portBusyError{port: port, err: err}
	}
	return ln.Close()
}

// takeOverDir kills servers that earlier processes left running on this Dir.
func (s *Server) takeOverDir() error {
	for _, pid := range serversUsing(s.configPath()) {
		if _, mine := ours.Load(pid); mine {
			return fmt.Errorf("chserver: %s is in use by ClickHouse pid %d, started by this process", s.dir, pid)
		}
		s.log.Warn("clickhouse: killing a server left running on this directory", "dir", s.dir, "pid", pid)
		_ = signalGroup(pid, syscall.SIGKILL)
		deadline := time.Now().Add(10 * time.Second)
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("chserver: ClickHouse pid %d on %s does not die", pid, s.dir)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Our pid file is informational; a stale one is simply replaced.
	os.Remove(filepath.Join(s.dir, pidFile))
	return nil
}

// startLocked renders the config for v, starts the process and waits until
// it answers; it records the version the server reports.
func (s *Server) startLocked(ctx context.Context, v Version) error {
	if s.proc.Load() != nil {
		return errors.New("chserver: server is already running")
	}
	if err := s.takeOverDir(); err != nil {
		return err
	}
	cfg, users, err := RenderConfig(s.params(v))
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(s.dir, UsersFile), users); err != nil {
		return err
	}
	if err := writeFileAtomic(s.configPath(), cfg); err != nil {
		return err
	}
	s.renderedFor = v
	for _, port := range []int{s.tcpPort, s.httpPort} {
		if err := checkPortFree(port); err != nil {
			return err
		}
	}
	p, err := s.startProcess()
	if err != nil {
		return err
	}
	s.proc.Store(p)
	if err := s.waitReady(ctx, p); err != nil {
		if !s.exited(p) {
			_ = signalGroup(p.pid, syscall.SIGKILL)
			<-p.done
		}
		s.forget(p)
		return err
	}
	got, err := s.queryVersion(ctx)
	if err != nil {
		s.log.Warn("clickhouse: cannot read the server's version", "err", err)
		got = v
	}
	s.version = got
	return nil
}

// startProcess starts the server. On Linux the kernel sends the server
// SIGTERM when the thread that started it exits (Pdeathsig), so the start
// and the wait run on one locked OS thread that lives as long as the server.
func (s *Server) startProcess() (*process, error) {
	logPath := filepath.Join(s.dir, logSubdir, stdoutLogFile)
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chserver: %w", err)
	}
	fmt.Fprintf(out, "\n==== %s chserver: starting %s --config-file=%s\n", time.Now().Format(time.RFC3339), s.bin, s.configPath())
	args := append(append([]string{}, s.bin.Args...), "--config-file="+s.configPath())
	cmd := exec.Command(s.bin.Path, args...)
	cmd.Dir = s.dir
	cmd.Stdin = nil
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()

	p := &process{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		if parentDeathSignal {
			runtime.LockOSThread()
			// Not unlocked: the thread exits with this goroutine, after
			// the server has exited.
		}
		if err := cmd.Start(); err != nil {
			out.Close()
			started <- err
			return
		}
		p.pid = cmd.Process.Pid
		ours.Store(p.pid, s.dir)
		started <- nil
		p.err = cmd.Wait()
		ours.Delete(p.pid)
		out.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("chserver: start %s: %w", s.bin, err)
	}
	_ = os.WriteFile(filepath.Join(s.dir, pidFile), []byte(strconv.Itoa(p.pid)+"\n"), 0o644)
	return p, nil
}

func (s *Server) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second, Transport: noKeepAlive}
	pingURL := "http://" + s.HTTPAddr() + "/ping"
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for {
		if ok := ping(ctx, client, pingURL); ok {
			return nil
		}
		select {
		case <-p.done:
			err := fmt.Errorf("chserver: %s exited during start-up (%v) in %s", s.bin, p.err, s.dir)
			if port := s.busyPortInLogs(); port != 0 {
				err = &portBusyError{port: port, err: err}
			}
			return fmt.Errorf("%w\n%s", err, s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("chserver: ClickHouse in %s did not answer %s within %s: %w\n%s",
				s.dir, pingURL, time.Since(start).Round(time.Millisecond), ctx.Err(), s.logTail())
		case <-tick.C:
		}
	}
}

// noKeepAlive leaves no idle connection behind: ClickHouse waits for open
// HTTP connections (up to keep_alive_timeout) when it shuts down.
var noKeepAlive = &http.Transport{DisableKeepAlives: true, Proxy: nil}

func ping(ctx context.Context, c *http.Client, u string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	return resp.StatusCode == http.StatusOK && strings.HasPrefix(string(b), "Ok.")
}

// queryVersion asks the running server for version() over HTTP.
func (s *Server) queryVersion(ctx context.Context) (Version, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u := "http://" + s.HTTPAddr() + "/?query=" + url.QueryEscape("SELECT version()")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Version{}, err
	}
	resp, err := (&http.Client{Transport: noKeepAlive}).Do(req)
	if err != nil {
		return Version{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return Version{}, fmt.Errorf("SELECT version(): %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return ParseVersion(string(b))
}

// busyPortInLogs returns our port that the server's start-up output says is
// taken, or 0.
func (s *Server) busyPortInLogs() int {
	text := readTail(filepath.Join(s.dir, logSubdir, stdoutLogFile), 16<<10) +
		readTail(filepath.Join(s.dir, logSubdir, errorLogFile), 16<<10)
	if !strings.Contains(text, "Address already in use") {
		return 0
	}
	for _, port := range []int{s.tcpPort, s.httpPort} {
		if strings.Contains(text, ":"+strconv.Itoa(port)) {
			return port
		}
	}
	return s.tcpPort
}

// logTail is the end of the server's start-up output and error log, for
// error messages.
func (s *Server) logTail() string {
	var b strings.Builder
	for _, name := range []string{stdoutLogFile, errorLogFile} {
		path := filepath.Join(s.dir, logSubdir, name)
		t := strings.TrimSpace(readTail(path, 3000))
		if t == "" {
			continue
		}
		fmt.Fprintf(&b, "--- tail of %s:\n%s\n", path, t)
	}
	if b.Len() == 0 {
		return "(the server wrote no log in " + filepath.Join(s.dir, logSubdir) + ")"
	}
	return b.String()
}

func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - n
	if off < 0 {
		off = 0
	}
	b := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	if off > 0 {
		// Drop the partial first line.
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("chserver: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("chserver: %w", err)
	}
	return nil
}
