package chserver

import (
	"bytes"
	"encoding/xml"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// node is a generic XML element, enough to look up paths in a config.
type node struct {
	XMLName  xml.Name
	Text     string `xml:",chardata"`
	Children []node `xml:",any"`
}

func parseXML(t *testing.T, b []byte) node {
	t.Helper()
	var n node
	if err := xml.Unmarshal(b, &n); err != nil {
		t.Fatalf("not well-formed XML: %v\n%s", err, b)
	}
	return n
}

// all returns the texts of every element at a slash-separated path below n.
func (n node) all(path string) []string {
	first, rest, more := strings.Cut(path, "/")
	var out []string
	for _, c := range n.Children {
		if c.XMLName.Local != first {
			continue
		}
		if more {
			out = append(out, c.all(rest)...)
		} else {
			out = append(out, strings.TrimSpace(c.Text))
		}
	}
	return out
}

func (n node) get(t *testing.T, path string) string {
	t.Helper()
	v := n.all(path)
	if len(v) != 1 {
		t.Fatalf("%s: found %d elements %q, want 1", path, len(v), v)
	}
	return v[0]
}

func TestRenderConfig(t *testing.T) {
	const dir = "/srv/ch & co" // an ampersand must come out escaped
	tests := []struct {
		name         string
		version      Version
		root         string
		lowCardFlag  []string
		extraProfile int
	}{
		{name: "18.16 (Debian)", version: Version{18, 16, 1, 0}, root: "yandex", lowCardFlag: []string{"1"}},
		{name: "18.12 first with LowCardinality", version: Version{18, 12, 0, 0}, root: "yandex", lowCardFlag: []string{"1"}},
		{name: "18.10 before LowCardinality", version: Version{18, 10, 0, 0}, root: "yandex"},
		{name: "19.3 flag obsolete", version: Version{19, 3, 0, 0}, root: "yandex"},
		{name: "21.8", version: Version{21, 8, 15, 7}, root: "yandex"},
		{name: "22.1", version: Version{22, 1, 0, 0}, root: "clickhouse"},
		{name: "24.8", version: Version{24, 8, 4, 13}, root: "clickhouse"},
		{name: "unknown version", version: Version{}, root: "yandex"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, users, err := RenderConfig(ConfigParams{Dir: dir, TCPPort: 9100, HTTPPort: 8200, Version: tt.version})
			if err != nil {
				t.Fatal(err)
			}
			c, u := parseXML(t, cfg), parseXML(t, users)
			if c.XMLName.Local != tt.root || u.XMLName.Local != tt.root {
				t.Errorf("root elements %q / %q, want %q", c.XMLName.Local, u.XMLName.Local, tt.root)
			}
			for path, want := range map[string]string{
				"listen_host":        "127.0.0.1",
				"tcp_port":           "9100",
				"http_port":          "8200",
				"path":               dir + "/data/",
				"tmp_path":           dir + "/tmp/",
				"user_files_path":    dir + "/user_files/",
				"format_schema_path": dir + "/format_schemas/",
				"logger/log":         dir + "/logs/clickhouse-server.log",
				"logger/errorlog":    dir + "/logs/clickhouse-server.err.log",
				"users_config":       dir + "/users.xml",
				"mark_cache_size":    "67108864",
				"default_profile":    "default",
			} {
				if got := c.get(t, path); got != want {
					t.Errorf("config %s = %q, want %q", path, got, want)
				}
			}
			if !bytes.Contains(cfg, []byte("/srv/ch &amp; co/data/")) {
				t.Errorf("Dir is not XML-escaped:\n%s", cfg)
			}
			// Nothing may point outside Dir (no /var/lib/clickhouse defaults).
			if bytes.Contains(cfg, []byte("/var/")) || bytes.Contains(cfg, []byte("/etc/")) {
				t.Errorf("config refers to a path outside Dir:\n%s", cfg)
			}
			if got := u.get(t, "users/default/password"); got != "" {
				t.Errorf("default user has password %q", got)
			}
			if got, want := u.all("users/default/networks/ip"), []string{"::1", "127.0.0.1"}; !reflect.DeepEqual(got, want) {
				t.Errorf("networks = %q, want %q", got, want)
			}
			if got := u.get(t, "users/default/profile"); got != "default" {
				t.Errorf("profile = %q", got)
			}
			if len(u.all("quotas/default")) != 1 {
				t.Errorf("no default quota:\n%s", users)
			}
			if got := u.all("profiles/default/allow_experimental_low_cardinality_type"); !reflect.DeepEqual(got, tt.lowCardFlag) {
				t.Errorf("allow_experimental_low_cardinality_type = %q, want %q", got, tt.lowCardFlag)
			}
			if !bytes.Contains(cfg, []byte("ClickHouse "+tt.version.String())) {
				t.Errorf("header does not name the version %s", tt.version)
			}
		})
	}
}

func TestRenderConfigRejects(t *testing.T) {
	for name, p := range map[string]ConfigParams{
		"relative dir": {Dir: "rel", TCPPort: 1, HTTPPort: 2},
		"no ports":     {Dir: "/x"},
		"same ports":   {Dir: "/x", TCPPort: 9000, HTTPPort: 9000},
		"port range":   {Dir: "/x", TCPPort: 9000, HTTPPort: 70000},
	} {
		if _, _, err := RenderConfig(p); err == nil {
			t.Errorf("%s: RenderConfig(%+v) succeeded", name, p)
		}
	}
}

var update = flag.Bool("update", false, "rewrite deploy/clickhouse/*.xml from the templates")

// deployDataDir is the data directory the checked-in CI config uses;
// deploy/clickhouse/start-local.sh substitutes another one.
const deployDataDir = "/var/lib/trace-ci-clickhouse"

// TestDeployConfigUpToDate keeps deploy/clickhouse/{config,users}.xml equal to
// what the templates render for Debian's 18.16 with the CI paths and ports.
// Regenerate them with: go test ./internal/chserver -run TestDeployConfigUpToDate -update
func TestDeployConfigUpToDate(t *testing.T) {
	cfg, users, err := RenderConfig(ConfigParams{
		Dir: deployDataDir, TCPPort: 9000, HTTPPort: 8123, Version: Version{18, 16, 1, 0},
		Note: "Do not edit: regenerate with go test ./internal/chserver -run TestDeployConfigUpToDate -update",
	})
	if err != nil {
		t.Fatal(err)
	}
	deploy := filepath.Join("..", "..", "deploy", "clickhouse")
	for name, want := range map[string][]byte{"config.xml": cfg, "users.xml": users} {
		path := filepath.Join(deploy, name)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is out of date; run: go test ./internal/chserver -run TestDeployConfigUpToDate -update", path)
		}
	}
}
