package schemas

// specialMasks64 returns, for the 64 bytes at p, the masks of the quotes,
// the backslashes and the control characters (bit i for p[i];
// masks_amd64.s, SSE2).
//
//go:noescape
func specialMasks64(p *byte) (quote, backslash, ctl uint64)
