package bus_test

import (
	"testing"

	"github.com/traceops/trace/internal/bus"
)

func TestRedactURLs(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://user:s3cret@a:4222", "nats://user:xxxxx@a:4222"},
		{"nats://user:s3cret@a:4222,nats://b:4222,nats://u2:p2@c:4222", "nats://user:xxxxx@a:4222,nats://b:4222,nats://u2:xxxxx@c:4222"},
		{"nats://tokenonly@a:4222", "nats://tokenonly@a:4222"}, // a user without a password: nothing to mask
		{"https://ci:TOKEN@hooks.example/train?x=1", "https://ci:xxxxx@hooks.example/train?x=1"},
	} {
		if got := bus.RedactURLs(c.in); got != c.want {
			t.Errorf("RedactURLs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
