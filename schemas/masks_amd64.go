package schemas

// specialMasks64 returns, for the 64 bytes at p, the masks of the quotes,
// the backslashes and the control characters (bit i for p[i];
// masks_amd64.s, SSE2).
//
//go:noescape
func specialMasks64(p *byte) (quote, backslash, ctl uint64)

// masks64 is specialMasks64 of b[:64] (len(b) >= 64).
func masks64(b []byte) (quote, backslash, ctl uint64) { return specialMasks64(&b[0]) }
