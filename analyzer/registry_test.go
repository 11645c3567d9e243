package analyzer

import "testing"

func testDict(env, av string, v uint32, capName string) *Dictionary {
	return &Dictionary{Environment: env, AgentVersion: av, Version: v,
		Capabilities: []Capability{{Name: capName, Definition: "a definition long enough to label against."}}}
}

// TestRegistryResolveOrder: the most specific dictionary wins, the default
// (environment "*") labels everything else.
func TestRegistryResolveOrder(t *testing.T) {
	g := NewRegistry()
	g.Put(testDict(AnyEnvironment, AnyVersion, 1, "default_cap"))
	g.Put(testDict("tau2-airline", AnyVersion, 2, "env_cap"))
	g.Put(testDict("tau2-airline", "gpt-4o", 3, "version_cap"))
	g.Put(testDict(AnyEnvironment, "v9", 4, "anyenv_cap"))
	for _, c := range []struct{ env, av, want string }{
		{"tau2-airline", "gpt-4o", "version_cap"},
		{"tau2-airline", "other", "env_cap"},
		{"tau2-retail", "v9", "anyenv_cap"},
		{"tau2-retail", "x", "default_cap"},
		{"anything", "", "default_cap"},
	} {
		d := g.Resolve(c.env, c.av)
		if d == nil || d.Capabilities[0].Name != c.want {
			t.Errorf("Resolve(%s, %s) = %v, want %s", c.env, c.av, d, c.want)
		}
		if got := g.Version(c.env, c.av, d.Version); got != d {
			t.Errorf("Version(%s, %s, %d) = %v", c.env, c.av, d.Version, got)
		}
	}
	if d := g.Version("tau2-retail", "x", 1); d == nil || !d.IsDefault() {
		t.Errorf("Version of the default = %v", d)
	}
	if d := NewRegistry().Resolve("x", "y"); d != nil {
		t.Errorf("empty registry resolved %v", d)
	}
}

// TestPrepareApply: an environment's own dictionary takes over from the
// default as a version above it, so their cohorts never share a key; the
// same content again is not stored twice.
func TestPrepareApply(t *testing.T) {
	g := NewRegistry()
	def := testDict(AnyEnvironment, AnyVersion, 1, "default_cap")
	if cur := g.PrepareApply(def); cur != nil || def.Version != 1 {
		t.Fatalf("first default: cur %v version %d", cur, def.Version)
	}
	g.Put(def)
	if cur := g.PrepareApply(testDict(AnyEnvironment, AnyVersion, 1, "default_cap")); cur != def {
		t.Errorf("same default again: cur %v, want the stored one", cur)
	}
	own := testDict("tau2-airline", AnyVersion, 1, "env_cap")
	if cur := g.PrepareApply(own); cur != nil || own.Version != 2 {
		t.Fatalf("own dictionary over the default: cur %v version %d, want 2", cur, own.Version)
	}
	g.Put(own)
	changed := testDict("tau2-airline", AnyVersion, 2, "env_cap_changed")
	if g.PrepareApply(changed); changed.Version != 3 {
		t.Errorf("changed content under the same version: version %d, want 3", changed.Version)
	}
	pinned := testDict("tau2-airline", "gpt-4o", 1, "version_cap")
	g.Put(changed)
	if g.PrepareApply(pinned); pinned.Version != 4 {
		t.Errorf("agent-version dictionary: version %d, want 4 (above the environment's 3)", pinned.Version)
	}
	far := testDict("tau2-airline", AnyVersion, 10, "env_cap_far")
	if g.PrepareApply(far); far.Version != 10 {
		t.Errorf("explicit higher version kept: %d", far.Version)
	}
}
