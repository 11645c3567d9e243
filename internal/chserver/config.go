package chserver

import (
	"bytes"
	"cmp"
	"embed"
	"encoding/xml"
	"fmt"
	"path/filepath"
	"strings"
	"text/template"
)

//go:embed templates/config.xml.tmpl templates/users.xml.tmpl
var templateFS embed.FS

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"x": xmlEscape,
}).ParseFS(templateFS, "templates/*.tmpl"))

// Defaults of ConfigParams.
const (
	DefaultListenHost = "127.0.0.1"
	// 64 MiB each: ClickHouse's own defaults (5 GiB marks, 8 GiB
	// uncompressed) are sized for a dedicated machine.
	DefaultMarkCacheSize         = 64 << 20
	DefaultUncompressedCacheSize = 64 << 20
)

// ConfigParams is everything the generated config.xml and users.xml depend on.
type ConfigParams struct {
	// Dir holds every path of the server: data, tmp, user files, format
	// schemas and logs. It must be absolute.
	Dir string
	// TCPPort is the native protocol port, HTTPPort the HTTP one.
	TCPPort, HTTPPort int
	// Version selects what the config may contain. The zero Version renders
	// a config with only settings that every version from 18.16 on accepts.
	Version Version
	// ListenHost defaults to DefaultListenHost.
	ListenHost string
	// LogLevel of the server's log file; "information" when empty.
	LogLevel string
	// Note is a sentence for the header comment of both files; it defaults
	// to saying that Start rewrites them.
	Note string
}

// Setting is one user-profile setting.
type Setting struct{ Name, Value string }

// Layout of Dir. Paths are relative to Dir.
const (
	ConfigFile      = "config.xml"
	UsersFile       = "users.xml"
	dataSubdir      = "data"
	tmpSubdir       = "tmp"
	userFilesSubdir = "user_files"
	formatSubdir    = "format_schemas"
	logSubdir       = "logs"
	// stdoutLogFile receives the server process's stdout and stderr: what it
	// prints before its own logger is set up (a bad config, a busy port).
	stdoutLogFile = "stdout.log"
	serverLogFile = "clickhouse-server.log"
	errorLogFile  = "clickhouse-server.err.log"
	pidFile       = "clickhouse-server.pid"
)

// ProfileSettings returns the settings the default profile needs on version v.
// Only settings v knows are returned: an unknown setting in a profile is an
// error on every version.
func ProfileSettings(v Version) []Setting {
	var s []Setting
	// LowCardinality(T) came in 18.12 behind this flag; 19.3 made the type
	// generally available and turned the flag into an obsolete no-op.
	if v.AtLeast(18, 12) && !v.AtLeast(19, 3) {
		s = append(s, Setting{"allow_experimental_low_cardinality_type", "1"})
	}
	// A ceiling on any one query's memory, so that no single query (an
	// analytics page over months of history) can take the machine, and
	// ingest with it. The dashboard's queries carry tighter limits of their
	// own (sink.Config.QueryMaxMemory, QueryTimeout). No time limit here:
	// ingest's streamed INSERTs and the migrations' one-time copies may
	// legitimately run long.
	s = append(s, Setting{"max_memory_usage", fmt.Sprint(EmbeddedMaxQueryMemory)})
	return s
}

// EmbeddedMaxQueryMemory is the embedded server's per-query memory ceiling
// (bytes): 8 GiB.
const EmbeddedMaxQueryMemory = 8 << 30

// rootElement is <yandex> up to 21.x; <clickhouse> from 22.1 on (21.10 added
// it, and later versions still accept <yandex>, but 22.1+ only documents
// <clickhouse>).
func rootElement(v Version) string {
	if v.AtLeast(22, 1) {
		return "clickhouse"
	}
	return "yandex"
}

// RenderConfig returns config.xml and users.xml for p.
func RenderConfig(p ConfigParams) (config, users []byte, err error) {
	if !filepath.IsAbs(p.Dir) {
		return nil, nil, fmt.Errorf("chserver: config dir %q is not absolute", p.Dir)
	}
	if p.TCPPort <= 0 || p.HTTPPort <= 0 || p.TCPPort > 65535 || p.HTTPPort > 65535 {
		return nil, nil, fmt.Errorf("chserver: bad ports tcp=%d http=%d", p.TCPPort, p.HTTPPort)
	}
	if p.TCPPort == p.HTTPPort {
		return nil, nil, fmt.Errorf("chserver: tcp and http port are both %d", p.TCPPort)
	}
	p.ListenHost = cmp.Or(p.ListenHost, DefaultListenHost)
	p.LogLevel = cmp.Or(p.LogLevel, "information")
	p.Note = cmp.Or(p.Note, "Do not edit: chserver.Start rewrites it on every start.")
	dir := filepath.Clean(p.Dir)
	data := struct {
		ConfigParams
		Root                                           string
		DataDir, TmpDir, UserFilesDir, FormatSchemaDir string
		LogDir, UsersConfig                            string
		MarkCacheSize, UncompressedCacheSize           int
		ProfileSettings                                []Setting
		Networks                                       []string
	}{
		ConfigParams:          p,
		Root:                  rootElement(p.Version),
		DataDir:               filepath.Join(dir, dataSubdir),
		TmpDir:                filepath.Join(dir, tmpSubdir),
		UserFilesDir:          filepath.Join(dir, userFilesSubdir),
		FormatSchemaDir:       filepath.Join(dir, formatSubdir),
		LogDir:                filepath.Join(dir, logSubdir),
		UsersConfig:           filepath.Join(dir, UsersFile),
		MarkCacheSize:         DefaultMarkCacheSize,
		UncompressedCacheSize: DefaultUncompressedCacheSize,
		ProfileSettings:       ProfileSettings(p.Version),
		Networks:              []string{"::1", "127.0.0.1"},
	}
	var c, u bytes.Buffer
	if err := templates.ExecuteTemplate(&c, "config.xml.tmpl", data); err != nil {
		return nil, nil, fmt.Errorf("chserver: render config.xml: %w", err)
	}
	if err := templates.ExecuteTemplate(&u, "users.xml.tmpl", data); err != nil {
		return nil, nil, fmt.Errorf("chserver: render users.xml: %w", err)
	}
	return c.Bytes(), u.Bytes(), nil
}

func xmlEscape(v any) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(fmt.Sprint(v)))
	return b.String()
}
