package chserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrNotFound is returned (wrapped) by Find when no ClickHouse server binary
// is on PATH.
var ErrNotFound = errors.New("chserver: no ClickHouse server binary on PATH")

// InstallHint says how to get a ClickHouse server binary.
const InstallHint = `install ClickHouse: on Debian/Ubuntu run "apt-get install -y clickhouse-server clickhouse-client" (as root), ` +
	`or get the official single binary ("curl https://clickhouse.com/ | sh", see https://clickhouse.com/docs/en/install) ` +
	`and put the resulting "clickhouse" executable on PATH`

// Binary is a ClickHouse server executable and how to invoke it.
type Binary struct {
	// Path of the executable.
	Path string
	// Args come before the server's own flags: ["server"] for the official
	// single "clickhouse" binary, nothing for clickhouse-server.
	Args []string
}

// String is the command line prefix, e.g. "/usr/bin/clickhouse server".
func (b Binary) String() string {
	return strings.Join(append([]string{b.Path}, b.Args...), " ")
}

// Find looks on PATH for clickhouse-server (distribution packages), and else
// for the official single binary clickhouse, run as "clickhouse server".
// Without either it returns an error wrapping ErrNotFound whose message says
// how to install one.
func Find() (Binary, error) {
	if p, err := exec.LookPath("clickhouse-server"); err == nil {
		return Binary{Path: p}, nil
	}
	if p, err := exec.LookPath("clickhouse"); err == nil {
		return Binary{Path: p, Args: []string{"server"}}, nil
	}
	// Debian installs clickhouse-server in /usr/sbin, which a non-root PATH
	// often lacks.
	for _, p := range sbinFallbacks {
		if isExecutable(p) {
			return Binary{Path: p}, nil
		}
	}
	return Binary{}, fmt.Errorf("%w (looked for clickhouse-server and clickhouse); %s", ErrNotFound, InstallHint)
}

// sbinFallbacks are tried when PATH has no ClickHouse.
var sbinFallbacks = []string{"/usr/sbin/clickhouse-server", "/usr/local/sbin/clickhouse-server"}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// DetectVersion finds out which ClickHouse version b is without starting it.
// It asks, in order: the binary itself (--version; Debian's 18.16
// clickhouse-server does not know that flag), a clickhouse-client in the
// same directory, dpkg for a packaged /usr/sbin/clickhouse-server, and a
// clickhouse-client on PATH. source says which answered. Start does not rely
// on this alone: it asks the running server too.
func (b Binary) DetectVersion(ctx context.Context) (v Version, source string, err error) {
	type probe struct {
		name string
		argv []string
	}
	probes := []probe{{"--version", append(append([]string{b.Path}, b.Args...), "--version")}}
	dir := filepath.Dir(b.Path)
	if filepath.Base(b.Path) == "clickhouse-server" {
		if c := filepath.Join(dir, "clickhouse-client"); isExecutable(c) {
			probes = append(probes, probe{"clickhouse-client --version", []string{c, "--version"}})
		}
		if dir == "/usr/sbin" || dir == "/usr/bin" {
			if dq, err := exec.LookPath("dpkg-query"); err == nil {
				probes = append(probes, probe{"dpkg", []string{dq, "-W", "-f=${Version}", "clickhouse-server"}})
			}
		}
		if c, err := exec.LookPath("clickhouse-client"); err == nil {
			probes = append(probes, probe{"clickhouse-client --version (PATH)", []string{c, "--version"}})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var errs []error
	for _, p := range probes {
		out, err := runQuiet(ctx, p.argv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", strings.Join(p.argv, " "), err))
			continue
		}
		v, err := ParseVersion(out)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return v, p.name, nil
	}
	return Version{}, "", fmt.Errorf("chserver: cannot tell the version of %s: %w", b, errors.Join(errs...))
}

func runQuiet(ctx context.Context, argv []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = time.Second // a grandchild holding the output pipe must not hang us
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, strings.TrimSpace(tail(out, 300)))
	}
	return string(out), nil
}

// tail returns at most n bytes from the end of b, starting at a line.
func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	b = b[len(b)-n:]
	if i := strings.IndexByte(string(b), '\n'); i >= 0 && i < len(b)-1 {
		b = b[i+1:]
	}
	return string(b)
}
