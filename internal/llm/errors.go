package llm

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
)

// Sentinel errors. A Request.Validate function wraps ErrInvalidJSON when the
// answer is not parseable and ErrSchema (or anything else) when it parses but
// is not acceptable; the attempt's audit outcome follows (invalid_json or
// schema) and both are retried.
var (
	ErrInvalidJSON = errors.New("invalid JSON")
	ErrSchema      = errors.New("schema violation")
)

// Error is returned by Chat when no attempt produced an accepted answer:
// the attempts ran out, or an attempt failed in a way that is not retried
// (a 4xx other than 408, 409 and 429). It says what every attempt ended with.
type Error struct {
	Purpose  string
	Attempts int      // HTTP attempts made
	Outcomes []string // the outcome of each attempt, in order
	Status   int      // HTTP status of the last attempt, 0 if it got none
	// Retryable is false when the last attempt was not retried because
	// retrying could not help (a 4xx other than 408, 409 and 429).
	Retryable bool
	Err       error // the last attempt's error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("llm")
	if e.Purpose != "" {
		b.WriteString(" " + e.Purpose)
	}
	if e.Retryable {
		fmt.Fprintf(&b, ": gave up after %d attempts (%s)", e.Attempts, strings.Join(e.Outcomes, ", "))
	} else {
		fmt.Fprintf(&b, ": %s, not retried (attempt %d; outcomes %s)", e.Outcome(), e.Attempts, strings.Join(e.Outcomes, ", "))
	}
	if e.Err != nil {
		b.WriteString(": last: ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the last attempt's error.
func (e *Error) Unwrap() error { return e.Err }

// Outcome is the last attempt's outcome.
func (e *Error) Outcome() string {
	if len(e.Outcomes) == 0 {
		return ""
	}
	return e.Outcomes[len(e.Outcomes)-1]
}

// Unavailable reports whether err (from Chat) says that the endpoint can
// answer no request as configured, whatever the request: it refused the
// credentials (401, 403), does not serve the model or the path (404), or
// could not be reached at all (connection refused, unknown host, no
// route), on every attempt. Such a failure is the deployment's, not the
// request's: a caller working through a backlog should wait for the
// endpoint rather than record every item as failed. Timeouts, 429 and 5xx
// are not included: one request can cause them (a prompt above a rate
// limit's request size, an input that crashes the server) while the others
// succeed.
func Unavailable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Status {
	case 401, 403, 404:
		return true
	case 0:
		var dns *net.DNSError
		return e.Outcome() == OutcomeNetwork && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENETUNREACH) ||
			errors.Is(err, syscall.EHOSTUNREACH) || (errors.As(err, &dns) && dns.IsNotFound))
	}
	return false
}

// StatusError is an HTTP answer with a non-2xx status.
type StatusError struct {
	Status  int
	Message string // the server's error message (OpenAI error.message), redacted and cut
}

func (e *StatusError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("HTTP %d", e.Status)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message)
}
