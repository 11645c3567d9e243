//go:build !amd64

package schemas

// masks64 is masks_amd64.s's masks of the quotes, backslashes and control
// characters of b[:64], one byte at a time.
func masks64(b []byte) (quote, backslash, ctl uint64) {
	for i, c := range b[:64] {
		switch {
		case c == '"':
			quote |= 1 << i
		case c == '\\':
			backslash |= 1 << i
		case c < 0x20:
			ctl |= 1 << i
		}
	}
	return quote, backslash, ctl
}
