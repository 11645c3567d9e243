package httpauth

import (
	"encoding/base64"
	"net"
	"testing"
)

func TestBearerAndBasicPassword(t *testing.T) {
	basic := func(userPass string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(userPass)) }
	for _, tt := range []struct{ authz, bearer, basic string }{
		{"Bearer s3cret", "s3cret", ""},
		{"bearer s3cret", "s3cret", ""}, // the scheme in any case (RFC 7235)
		{"BEARER  s3cret ", "s3cret", ""},
		{"s3cret", "s3cret", ""}, // bare
		{basic("trace:s3cret"), "", "s3cret"},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("any:s3cret")), "", "s3cret"},
		{basic("no-colon"), "", ""},
		{"Basic !!!", "", ""},
		{"Digest username=x", "", ""},
		{"", "", ""},
	} {
		if got := Bearer(tt.authz); got != tt.bearer {
			t.Errorf("Bearer(%q) = %q, want %q", tt.authz, got, tt.bearer)
		}
		if got := BasicPassword(tt.authz); got != tt.basic {
			t.Errorf("BasicPassword(%q) = %q, want %q", tt.authz, got, tt.basic)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, tt := range []struct {
		got  []string
		want bool
	}{
		{[]string{"s3cret"}, true},
		{[]string{"", "s3cret"}, true},
		{[]string{"wrong", ""}, false},
		{[]string{""}, false},
		{nil, false},
	} {
		if Match("s3cret", tt.got...) != tt.want {
			t.Errorf("Match(%q) != %v", tt.got, tt.want)
		}
	}
}

func TestExposed(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		token string
		want  bool
	}{
		{"127.0.0.1:8080", "", false},
		{"[::1]:8080", "", false},
		{"0.0.0.0:8080", "", true},
		{"[::]:8080", "", true},
		{"10.1.2.3:8080", "", true},
		{"0.0.0.0:8080", "s3cret", false},
	} {
		a, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := Exposed(a, tc.token); got != tc.want {
			t.Errorf("Exposed(%s, %q) = %v, want %v", tc.addr, tc.token, got, tc.want)
		}
	}
}
