package dispatch

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries the HMAC-SHA256 signature of a webhook POST and
// of a callback: "t=<unix seconds>,v1=<hex>", where the hex is
// HMAC-SHA256(secret, "<t>." + body). The timestamp is signed with the
// body, so a receiver that rejects old timestamps rejects replays.
const SignatureHeader = "X-Trace-Signature"

// DefaultSignatureTolerance is how far a signature's timestamp may be from
// the receiver's clock.
const DefaultSignatureTolerance = 5 * time.Minute

// Signature errors.
var (
	ErrNoSignature  = errors.New("no " + SignatureHeader + " header")
	ErrBadSignature = errors.New("signature does not match")
	ErrStale        = errors.New("signature timestamp outside the tolerance")
)

// Sign is the SignatureHeader value of body at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks a SignatureHeader value against body: its timestamp within
// tolerance of now, and one of its v1 signatures equal (in constant time)
// to HMAC-SHA256(secret, "<t>." + body). Several v1 entries are allowed
// (a sender rotating its secret signs with both).
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	_, err := VerifiedMAC(secret, header, body, now, tolerance)
	return err
}

// VerifiedMAC is Verify, and on success the hex of the signature that
// matched, recomputed: it names the signed (timestamp, body) whatever
// else the header holds, so a request replayed with other v1 entries
// added still has the same one.
func VerifiedMAC(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) (string, error) {
	if strings.TrimSpace(header) == "" {
		return "", ErrNoSignature
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return "", fmt.Errorf("malformed %s: %q is not key=value", SignatureHeader, part)
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil {
				return "", fmt.Errorf("malformed %s: v1 is not hex", SignatureHeader)
			}
			sigs = append(sigs, b)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("malformed %s: t=%q is not unix seconds", SignatureHeader, ts)
	}
	if len(sigs) == 0 {
		return "", fmt.Errorf("malformed %s: no v1 signature", SignatureHeader)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return "", fmt.Errorf("%w: t=%d is %s from now (tolerance %s)", ErrStale, sec, d.Round(time.Second), tolerance)
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return hex.EncodeToString(want), nil
		}
	}
	return "", ErrBadSignature
}
