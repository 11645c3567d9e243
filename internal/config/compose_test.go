package config

import (
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeVar is a compose interpolation, ${NAME:-default} or ${NAME}.
var composeVar = regexp.MustCompile(`\$\{(\w+)(?::-([^}]*))?\}`)

// TestComposeStack: docker-compose.yml, the production-shaped stack
// (docs/operations.md: production runs the roles as separate deployments,
// "see docker-compose.yml"), runs every role `trace run` runs by default —
// without synthesize and adapt the synthesis requests piled up on NATS and
// no guard rolled back a harmful adapter —, each trace service's
// environment (with compose's defaults) is a configuration trace accepts
// for its roles, and the adapt role points trainers at the serve role's
// environment server, not at its own 0.0.0.0 listener.
func TestComposeStack(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Build       any               `yaml:"build"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	var all []string
	for name, s := range f.Services {
		if s.Build == nil {
			continue // Kafka, ClickHouse, NATS
		}
		i := slices.Index(s.Command, "--roles")
		if len(s.Command) == 0 || s.Command[0] != "run" || i < 0 || i+1 >= len(s.Command) {
			t.Errorf("service %s: command %q is not run --roles ROLES", name, s.Command)
			continue
		}
		roles := s.Command[i+1]
		all = append(all, strings.Split(roles, ",")...)
		t.Run(name, func(t *testing.T) {
			for k, v := range s.Environment {
				t.Setenv(k, composeVar.ReplaceAllString(v, "$2"))
			}
			cfg, err := Load("", []string{"roles=" + roles})
			if err != nil {
				t.Fatalf("roles %s: %v", roles, err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("roles %s: %v", roles, err)
			}
			if !cfg.Has("adapt") {
				return
			}
			u, err := url.Parse(cfg.EnvServerURL())
			if err != nil || u.Hostname() == "" || u.Hostname() == "0.0.0.0" || u.Hostname() == "127.0.0.1" || u.Hostname() == "localhost" {
				t.Errorf("the adapt role points trainers at %q, not at the serve role (adapter.plan.env_server_url)", cfg.EnvServerURL())
			}
		})
	}
	for _, r := range DefaultRoles {
		if !slices.Contains(all, r) {
			t.Errorf("no service runs the %s role (the stack runs %v; trace run's default roles are %v)", r, all, DefaultRoles)
		}
	}
}
