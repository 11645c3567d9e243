//go:build !amd64

package schemas

import "unsafe"

// specialMasks64 is masks_amd64.s's masks of the quotes, backslashes and
// control characters of the 64 bytes at p, one byte at a time.
func specialMasks64(p *byte) (quote, backslash, ctl uint64) {
	for i, c := range unsafe.Slice(p, 64) {
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
