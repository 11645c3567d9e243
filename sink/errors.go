package sink

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	sqldriver "database/sql/driver"
	"github.com/ClickHouse/clickhouse-go/v2"
)

// Retryable ClickHouse server error codes: the same insert can succeed later.
var retryableCodes = map[int32]string{
	3:   "UNEXPECTED_END_OF_FILE",
	159: "TIMEOUT_EXCEEDED",
	160: "TOO_SLOW",
	164: "READONLY",
	202: "TOO_MANY_SIMULTANEOUS_QUERIES",
	203: "NO_FREE_CONNECTION",
	209: "SOCKET_TIMEOUT",
	210: "NETWORK_ERROR",
	241: "MEMORY_LIMIT_EXCEEDED",
	242: "TABLE_IS_READ_ONLY",
	243: "NOT_ENOUGH_SPACE",
	252: "TOO_MANY_PARTS",
	285: "TOO_FEW_LIVE_REPLICAS",
	319: "UNKNOWN_STATUS_OF_INSERT",
	394: "QUERY_WAS_CANCELLED",
	425: "SYSTEM_ERROR",
	999: "KEEPER_EXCEPTION",
}

// IsRetryable classifies an error from the store: true when retrying the same
// operation later can succeed (server overloaded or unreachable, network
// failures, timeouts), false for errors that retrying cannot fix (bad SQL,
// type mismatch, unknown table, ...). A cancelled parent context is not
// retryable: the caller is shutting down.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		_, ok := retryableCodes[ex.Code]
		return ok || diskFull(ex)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, clickhouse.ErrAcquireConnTimeout) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe)
}

// ErrorCode returns the ClickHouse exception code, or 0.
func ErrorCode(err error) int32 {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return ex.Code
	}
	return 0
}

// diskFull reports a server file error caused by a full disk or an
// exhausted quota (ENOSPC, EDQUOT): 18.16 reports it as
// CANNOT_WRITE_TO_FILE_DESCRIPTOR or CANNOT_OPEN_FILE with the errno in the
// message. Freeing space fixes it, so it is backpressure, like a memory
// limit, not an error to stop on.
func diskFull(ex *clickhouse.Exception) bool {
	switch ex.Code {
	case 75, 76: // CANNOT_WRITE_TO_FILE_DESCRIPTOR, CANNOT_OPEN_FILE
		return strings.Contains(ex.Message, "errno: 28,") || strings.Contains(ex.Message, "errno: 122,") ||
			strings.Contains(ex.Message, "No space left on device") || strings.Contains(ex.Message, "Disk quota exceeded")
	}
	return false
}
