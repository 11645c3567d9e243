package layout

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/traceops/trace"

// rules: a package (or every package under a prefix ending in "/...") that
// must not depend, directly or transitively, on the packages listed.
var rules = []struct {
	from string
	not  []string
	why  string
}{
	{"analyzer", []string{"ingest", "internal/bus", "internal/app"}, "the analyzer consumes interfaces it defines; the wiring adapts"},
	{"internal/llm", []string{"sink"}, "llm defines its own audit record"},
	{"internal/stream", []string{"ingest", "analyzer", "sink", "internal/app"}, "the stream runtime is generic"},
	{"sink", []string{"ingest", "analyzer", "internal/..."}, "storage knows only the wire schemas"},
	{"schemas", []string{"..."}, "the wire schemas depend on nothing of trace"},
	{"internal/bus", []string{"analyzer", "ingest", "sink", "internal/app"}, "the bus carries schemas only"},
	{"router", []string{"analyzer", "ingest", "internal/bus", "internal/app", "synthesizer/...", "adapter/..."}, "the router reads the registry and the dictionaries through interfaces it defines; the wiring adapts"},
}

// production is every package of the module except the tooling under
// internal/dev, the command (which may run dev tooling: demo, simulate,
// bench) and this test's package.
func production(pkg string) bool {
	rel, ok := strings.CutPrefix(pkg, module+"/")
	return ok && !strings.HasPrefix(rel, "internal/dev/") && !strings.HasPrefix(rel, "cmd/") && rel != "internal/layout"
}

func matches(pattern, rel string) bool {
	if pattern == "..." {
		return true
	}
	if p, ok := strings.CutSuffix(pattern, "/..."); ok {
		return rel == p || strings.HasPrefix(rel, p+"/")
	}
	return rel == pattern
}

// graph is `go list -deps` of the module (non-test imports).
func graph(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	g := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imps, _ := strings.Cut(line, "\t")
		g[pkg] = strings.Fields(imps)
	}
	if _, ok := g[module+"/analyzer"]; !ok {
		t.Fatalf("go list did not list %s/analyzer: run from the repository", module)
	}
	return g
}

// path is the import chain from pkg to the first package bad accepts, or nil.
func path(g map[string][]string, pkg string, bad func(string) bool) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g[p] {
			if _, seen := prev[imp]; seen || !strings.HasPrefix(imp, module+"/") {
				continue
			}
			prev[imp] = p
			if bad(imp) {
				var chain []string
				for q := imp; q != ""; q = prev[q] {
					chain = append(chain, strings.TrimPrefix(q, module+"/"))
				}
				slices.Reverse(chain)
				return chain
			}
			queue = append(queue, imp)
		}
	}
	return nil
}

// TestProductionDoesNotImportDev: no production package depends on
// internal/dev (simulators, benchmarks, test servers and helpers).
func TestProductionDoesNotImportDev(t *testing.T) {
	g := graph(t)
	n := 0
	for pkg := range g {
		if !production(pkg) {
			continue
		}
		n++
		if chain := path(g, pkg, func(p string) bool { return strings.HasPrefix(p, module+"/internal/dev/") }); chain != nil {
			t.Errorf("production package %s imports development tooling %s: %s",
				chain[0], chain[len(chain)-1], strings.Join(chain, " → "))
		}
	}
	if n < 10 {
		t.Fatalf("only %d production packages found", n)
	}
}

// TestImportArrows: the arrows between packages run one way.
func TestImportArrows(t *testing.T) {
	g := graph(t)
	for _, r := range rules {
		from := module + "/" + r.from
		if _, ok := g[from]; !ok {
			t.Errorf("rule for %s: no such package", r.from)
			continue
		}
		bad := func(p string) bool {
			rel := strings.TrimPrefix(p, module+"/")
			return slices.ContainsFunc(r.not, func(n string) bool { return matches(n, rel) })
		}
		if chain := path(g, from, bad); chain != nil {
			t.Errorf("%s must not import %s (%s): %s", r.from, chain[len(chain)-1], r.why, strings.Join(chain, " → "))
		}
	}
}

// The checks themselves: a chain is found through an intermediate package.
func TestPathFindsTransitiveImports(t *testing.T) {
	g := map[string][]string{
		module + "/a": {module + "/b", "fmt"},
		module + "/b": {module + "/internal/dev/x"},
	}
	chain := path(g, module+"/a", func(p string) bool { return strings.HasPrefix(p, module+"/internal/dev/") })
	if want := []string{"a", "b", "internal/dev/x"}; !slices.Equal(chain, want) {
		t.Errorf("path = %v, want %v", chain, want)
	}
	if path(g, module+"/b", func(p string) bool { return p == module+"/a" }) != nil {
		t.Error("path found an import that is not there")
	}
	for _, tt := range []struct {
		pattern, rel string
		want         bool
	}{{"...", "x", true}, {"internal/...", "internal/bus", true}, {"internal/...", "internalx", false}, {"sink", "sink", true}, {"sink", "sinks", false}} {
		if got := matches(tt.pattern, tt.rel); got != tt.want {
			t.Errorf("matches(%q, %q) = %v", tt.pattern, tt.rel, got)
		}
	}
}

var pkgName = regexp.MustCompile(`^[a-z][a-z0-9]*(/[a-z][a-z0-9]*)*$`)

// TestArchitectureDocListsEveryPackage: docs/ARCHITECTURE.md's package map
// describes every package of the module in a row of its table, and lists
// no package that no longer exists.
func TestArchitectureDocListsEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	section, _, _ := strings.Cut(string(doc[strings.Index(string(doc), "## Package map"):]), "\n## ")
	var rows []string // the first cell of each row of the table
	for _, line := range strings.Split(section, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.HasPrefix(line, "| `") {
			rows = append(rows, cells[1])
		}
	}
	described := map[string]bool{}
	for _, row := range rows {
		for _, name := range strings.Split(row, "`") {
			if name = strings.TrimSuffix(strings.TrimSpace(name), "/"); pkgName.MatchString(name) {
				described[name] = true
			}
		}
	}
	g := graph(t)
	for pkg := range g {
		rel, ok := strings.CutPrefix(pkg, module+"/")
		if !ok {
			continue
		}
		// A package may be described in its parent's row (verify/verifytest).
		if !described[rel] && !strings.Contains(section, "`"+rel+"`") {
			t.Errorf("docs/ARCHITECTURE.md's package map does not describe %s", rel)
		}
	}
	for name := range described {
		if name == "trainer" { // the Python reference trainer
			continue
		}
		if _, ok := g[module+"/"+name]; !ok {
			t.Errorf("docs/ARCHITECTURE.md's package map describes %s, which is not a package of the module", name)
		}
	}
}
