// Package httpauth is trace's static-token model, shared by its HTTP
// servers (the dashboard and API, the environment server, the routing
// proxy): a client sends the token as "Authorization: Bearer T" (the
// scheme in any case, RFC 7235) or bare; the environment server also takes
// it as the password of HTTP Basic authentication (openenv's WebSocket
// client, which cannot set headers, sends it from the URL,
// ws://trace:T@host/…).
package httpauth

import (
	"crypto/subtle"
	"encoding/base64"
	"net"
	"strings"
)

// Bearer is the token of an Authorization header value: a Bearer
// scheme's credentials, or the whole value when it has no scheme; "" for
// another scheme.
func Bearer(authz string) string {
	scheme, cred, ok := cut(authz)
	switch {
	case !ok:
		return scheme
	case strings.EqualFold(scheme, "Bearer"):
		return cred
	}
	return ""
}

// BasicPassword is the password of a Basic scheme's credentials (the
// user name is anything), "" for another scheme or malformed credentials.
func BasicPassword(authz string) string {
	scheme, cred, ok := cut(authz)
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(cred)
	if err != nil {
		return ""
	}
	_, pass, _ := strings.Cut(string(b), ":")
	return pass
}

// cut splits an Authorization value into its scheme and credentials.
func cut(authz string) (scheme, cred string, ok bool) {
	scheme, cred, ok = strings.Cut(strings.TrimSpace(authz), " ")
	return scheme, strings.TrimSpace(cred), ok
}

// Match reports whether any of got is the token, comparing in constant
// time; "" never matches.
func Match(token string, got ...string) bool {
	for _, g := range got {
		if g != "" && subtle.ConstantTimeCompare([]byte(g), []byte(token)) == 1 {
			return true
		}
	}
	return false
}

// Exposed reports whether a server listening on addr without a token
// (token "") is open to other machines: no token and not a loopback
// address (0.0.0.0 and :: listen on every interface). Its callers log a
// warning at start; the defaults (127.0.0.1) are not exposed.
func Exposed(addr net.Addr, token string) bool {
	if token != "" {
		return false
	}
	tcp, ok := addr.(*net.TCPAddr)
	return !ok || !tcp.IP.IsLoopback()
}
