package sink

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Config locates a ClickHouse server. The zero value is not usable: Addr is required.
type Config struct {
	Addr          []string      `koanf:"addr"`     // host:port of the native protocol (9000)
	Database      string        `koanf:"database"` // default "trace"; created if missing
	User          string        `koanf:"user"`     // default "default"
	Password      string        `koanf:"password"` // secret: never logged
	TLS           bool          `koanf:"tls"`
	TLSSkipVerify bool          `koanf:"tls_skip_verify"`
	DialTimeout   time.Duration `koanf:"dial_timeout"`   // default 5s
	MaxOpenConns  int           `koanf:"max_open_conns"` // default 8
	RetentionDays int           `koanf:"retention_days"` // TTL on rollouts/labels when the server supports TTL; 0 = keep forever
	// Compression of the native protocol: auto (default: none when every
	// address is a loopback one, where compressing only costs CPU on both
	// ends, else lz4), lz4, zstd or none.
	Compression string `koanf:"compression"`
	// Limits of each dashboard / report query (settings sent with the
	// query, enforced by the server, which cancels the query): the time
	// (default 10s) and the memory (default 1 GiB), so that analytics
	// cannot starve ingest. 0 takes the default; -1 turns a limit off.
	QueryTimeout   time.Duration `koanf:"query_timeout"`
	QueryMaxMemory int64         `koanf:"query_max_memory"`
	// An INSERT waiting on the server longer than this (default 10s) is
	// logged as stalled, naming its table and rows, and again every three
	// times as long while it stays stuck (see sink/stall.go).
	StallWarning time.Duration `koanf:"stall_warning"`
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	c.Database = cmp.Or(c.Database, "trace")
	c.User = cmp.Or(c.User, "default")
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.MaxOpenConns <= 0 {
		c.MaxOpenConns = 8
	}
	c.Compression = cmp.Or(c.Compression, "auto")
	if c.QueryTimeout == 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	if c.QueryMaxMemory == 0 {
		c.QueryMaxMemory = DefaultQueryMaxMemory
	}
	if c.StallWarning == 0 {
		c.StallWarning = DefaultStallWarning
	}
	return c
}

// The default limits of a dashboard query (Config.QueryTimeout,
// QueryMaxMemory).
const (
	DefaultQueryTimeout   = 10 * time.Second
	DefaultQueryMaxMemory = 1 << 30
)

// Validate names the first bad field.
func (c Config) Validate() error {
	if len(c.Addr) == 0 {
		return errors.New("clickhouse.addr: at least one host:port is required")
	}
	for _, a := range c.Addr {
		if !strings.Contains(a, ":") {
			return fmt.Errorf("clickhouse.addr: %q is not host:port", a)
		}
	}
	if c.Database != "" && !identRe.MatchString(c.Database) {
		return fmt.Errorf("clickhouse.database: %q is not a plain identifier", c.Database)
	}
	if c.RetentionDays < 0 {
		return fmt.Errorf("clickhouse.retention_days: must be >= 0, got %d", c.RetentionDays)
	}
	if c.QueryTimeout < 0 && c.QueryTimeout != -1 {
		return fmt.Errorf("clickhouse.query_timeout: must be > 0, or -1 for none, got %s", c.QueryTimeout)
	}
	if c.StallWarning < 0 {
		return fmt.Errorf("clickhouse.stall_warning: must be > 0, got %s", c.StallWarning)
	}
	if c.QueryMaxMemory < -1 {
		return fmt.Errorf("clickhouse.query_max_memory: must be > 0 bytes, or -1 for none, got %d", c.QueryMaxMemory)
	}
	if _, err := compression(c.Compression, c.Addr); err != nil {
		return err
	}
	return nil
}

// compression maps clickhouse.compression to the driver's method.
func compression(name string, addrs []string) (clickhouse.CompressionMethod, error) {
	switch name {
	case "", "auto":
		for _, a := range addrs {
			if !isLoopback(a) {
				return clickhouse.CompressionLZ4, nil
			}
		}
		return clickhouse.CompressionNone, nil
	case "lz4":
		return clickhouse.CompressionLZ4, nil
	case "zstd":
		return clickhouse.CompressionZSTD, nil
	case "none":
		return clickhouse.CompressionNone, nil
	}
	return 0, fmt.Errorf("clickhouse.compression: %q is not auto, lz4, zstd or none", name)
}

// ProtocolCompression is the compression the connections use: none, lz4 or
// zstd (clickhouse.compression with auto resolved), or an error naming the
// field.
func (c Config) ProtocolCompression() (string, error) {
	m, err := compression(c.Compression, c.Addr)
	if err != nil {
		return "", err
	}
	return m.String(), nil
}

// isLoopback reports whether host:port names this machine by a loopback
// address or "localhost".
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Store is a connection pool to one ClickHouse database. It is safe for
// concurrent use.
type Store struct {
	conn     driver.Conn
	cfg      Config
	version  Version
	features Features
	loc      *time.Location // the server's time zone (handshake), UTC when it sent none
	log      *slog.Logger
	wm       rollupStateCache // the rollup's watermark for the dashboard's statements (sink/rollupstate.go)
	stall    *stallWatch      // times every INSERT (sink/stall.go)
}

// Open connects, creates the database if needed and detects the server's
// features. It does not migrate: call Migrate.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	boot, err := open(cfg, "default", nil)
	if err != nil {
		return nil, err
	}
	defer boot.Close()
	if err := boot.Ping(ctx); err != nil {
		return nil, fmt.Errorf("clickhouse %v: %w", cfg.Addr, err)
	}
	sv, err := boot.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("clickhouse %v: server version: %w", cfg.Addr, err)
	}
	if err := boot.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+cfg.Database); err != nil {
		return nil, fmt.Errorf("clickhouse: create database %s: %w", cfg.Database, err)
	}
	v := Version{int(sv.Version.Major), int(sv.Version.Minor), int(sv.Version.Patch)}
	features := FeaturesFor(v)
	conn, err := open(cfg, cfg.Database, sessionSettings(features))
	if err != nil {
		return nil, err
	}
	loc := sv.Timezone
	if loc == nil {
		loc = time.UTC
	}
	stall := newStallWatch(cfg, log)
	s := &Store{conn: &watchedConn{Conn: conn, w: stall}, cfg: cfg, version: v, features: features, loc: loc, log: log, stall: stall}
	return s, nil
}

// sessionSettings are the settings of every statement of the store.
//
// max_partitions_per_insert_block = 0: the tables are partitioned by month
// of a producer's time (a rollout's end time, a label's ts), and a server
// that limits the partitions of one INSERT block (100 by default) refuses a
// batch spanning more months with TOO_MANY_PARTS, which is retryable for
// its other cause (merges behind): the same batch was retried forever and
// ingest stopped. 18.16 has neither the limit nor the setting (it would
// refuse every statement naming it).
func sessionSettings(f Features) clickhouse.Settings {
	if !f.PartitionLimit {
		return nil
	}
	return clickhouse.Settings{"max_partitions_per_insert_block": 0}
}

func open(cfg Config, db string, settings clickhouse.Settings) (driver.Conn, error) {
	opt := &clickhouse.Options{
		Addr:         cfg.Addr,
		Auth:         clickhouse.Auth{Database: db, Username: cfg.User, Password: cfg.Password},
		DialTimeout:  cfg.DialTimeout,
		MaxOpenConns: cfg.MaxOpenConns,
		MaxIdleConns: cfg.MaxOpenConns,
		Settings:     settings,
	}
	method, err := compression(cfg.Compression, cfg.Addr)
	if err != nil {
		return nil, err
	}
	if method != clickhouse.CompressionNone {
		opt.Compression = &clickhouse.Compression{Method: method}
	}
	if cfg.TLS {
		opt.TLS = &tls.Config{InsecureSkipVerify: cfg.TLSSkipVerify} //nolint:gosec // opt-in by config
	}
	conn, err := clickhouse.Open(opt)
	if err != nil {
		return nil, fmt.Errorf("clickhouse %v: %w", cfg.Addr, err)
	}
	return conn, nil
}

// Config is the configuration the store was opened with (defaults filled
// in), for a tool that opens its own connection to the same database (test
// helpers; see internal/dev/testenv.StoreConn). Every statement of trace
// itself is a method of Store.
func (s *Store) Config() Config { return s.cfg }

// Version is the server's version.
func (s *Store) Version() Version { return s.version }

// Location is the server's time zone, in which the DateTime columns'
// hour, day and week buckets (toStartOfHour, toStartOfDay, toMonday)
// start.
func (s *Store) Location() *time.Location { return s.loc }

// Features are the optional features in use.
func (s *Store) Features() Features { return s.features }

// Database is the database the store writes to.
func (s *Store) Database() string { return s.cfg.Database }

// Close releases the pool.
func (s *Store) Close() error { return s.conn.Close() }

// Ping checks that the server answers.
func (s *Store) Ping(ctx context.Context) error { return s.conn.Ping(ctx) }

// Version of a ClickHouse server.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast compares versions.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// Features are the optional features a server supports. 18.16 has none of
// them; every ClickHouse from 20.1 on has all of them.
type Features struct {
	LowCardinality bool // LowCardinality(String) without an experimental setting
	Codecs         bool // CODEC(ZSTD(n)) on large text columns
	TTL            bool // table TTL for retention
	PartitionLimit bool // max_partitions_per_insert_block, lifted by the store (sessionSettings)
}

// FeaturesFor returns what a version supports.
func FeaturesFor(v Version) Features {
	modern := v.AtLeast(20, 1)
	return Features{LowCardinality: modern, Codecs: modern, TTL: modern, PartitionLimit: modern}
}
