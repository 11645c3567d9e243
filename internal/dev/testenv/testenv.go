// Package testenv gives integration tests real servers: a Kafka-protocol
// broker, an embedded NATS JetStream server and a ClickHouse database.
//
// By default everything runs locally and needs nothing but the clickhouse
// binary: Kafka is an in-process kfake cluster, NATS an embedded
// nats-server, ClickHouse a server that internal/chserver starts once per
// test binary. Environment variables point tests at external servers:
//
//	TRACE_TEST_KAFKA=apache          use Apache Kafka at TRACE_TEST_KAFKA_BROKERS
//	TRACE_TEST_KAFKA_BROKERS=h:p,... (default 127.0.0.1:19092)
//	TRACE_TEST_CLICKHOUSE=host:port  use that ClickHouse (native protocol)
//	TRACE_REQUIRE_SERVERS=1          a missing server fails the test (CI)
//
// When a server is not available (no ClickHouse binary, an unreachable
// broker) the test is skipped with a message saying why, unless
// TRACE_REQUIRE_SERVERS=1, when it fails instead.
//
// A package whose tests use ClickHouse should have
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// so the shared local server is stopped and its directory removed when the
// tests end.
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Environment variables read by this package.
const (
	EnvKafka          = "TRACE_TEST_KAFKA"
	EnvKafkaBrokers   = "TRACE_TEST_KAFKA_BROKERS"
	EnvClickHouse     = "TRACE_TEST_CLICKHOUSE"
	EnvRequireServers = "TRACE_REQUIRE_SERVERS"

	// DefaultApacheBrokers is used with TRACE_TEST_KAFKA=apache when
	// TRACE_TEST_KAFKA_BROKERS is empty.
	DefaultApacheBrokers = "127.0.0.1:19092"
)

// RequireServers reports whether TRACE_REQUIRE_SERVERS=1: a missing server
// is then a test failure instead of a skip.
func RequireServers() bool { return os.Getenv(EnvRequireServers) == "1" }

// Unavailable ends the test because a server it needs is not there: a skip,
// or a failure when TRACE_REQUIRE_SERVERS=1.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if RequireServers() {
		t.Fatalf("%s (%s=1, so this fails instead of skipping)", msg, EnvRequireServers)
	}
	t.Skipf("%s (skipped; set %s=1 to make this a failure)", msg, EnvRequireServers)
}

// Main runs the tests of a package and then stops the servers this package
// started for the whole test binary. Use it as
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	stopShared()
	os.Exit(code)
}

// uniqueName returns prefix<sep><test name><sep><random>, using only
// [a-z0-9] and sep, at most maxLen bytes: a name no other test, run or process
// uses.
func uniqueName(t testing.TB, prefix string, sep byte, maxLen int) string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	suffix := hex.EncodeToString(b[:])
	name := sanitize(t.Name(), sep)
	room := maxLen - len(prefix) - len(suffix) - 2
	if room < 0 {
		room = 0
	}
	if len(name) > room {
		name = name[len(name)-room:] // the end of a subtest name says most
	}
	parts := []string{}
	for _, p := range []string{sanitize(prefix, sep), strings.Trim(name, string(sep)), suffix} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, string(sep))
}

// sanitize lowercases s and turns every run of characters other than
// [a-z0-9] into one sep, with none at either end.
func sanitize(s string, sep byte) string {
	var b strings.Builder
	pending := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			if pending && b.Len() > 0 {
				b.WriteByte(sep)
			}
			pending = false
			b.WriteRune(r)
		} else {
			pending = true
		}
	}
	return b.String()
}

// scratchPrefix starts the names of directories this package makes outside
// t.TempDir(); the test binary's pid follows, so leftovers of a killed test
// binary can be recognised and removed.
const scratchPrefix = "trace-testenv-"

var sweepOnce sync.Once

// scratchDir returns a new directory on tmpfs (/dev/shm) if there is one,
// else in t.TempDir(), removed when t ends.
func scratchDir(t testing.TB, kind string) string {
	t.Helper()
	const shm = "/dev/shm"
	if fi, err := os.Stat(shm); err == nil && fi.IsDir() {
		sweepOnce.Do(func() { removeStaleDirs(shm) })
		dir, err := os.MkdirTemp(shm, scratchPrefix+kind+"-"+strconv.Itoa(os.Getpid())+"-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return filepath.Join(t.TempDir(), kind)
}

// removeStaleDirs removes scratch directories in parent whose test binary
// has exited without cleaning up (it was killed, or its TestMain did not
// call Main).
func removeStaleDirs(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, scratchPrefix+"*"))
	for _, d := range dirs {
		// trace-testenv-<kind>-<pid>-<random>
		parts := strings.Split(strings.TrimPrefix(filepath.Base(d), scratchPrefix), "-")
		if len(parts) < 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[len(parts)-2])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}
