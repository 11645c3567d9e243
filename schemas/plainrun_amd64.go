package schemas

// plainRun16 returns the index of the first byte of b that ends a run of
// plain string bytes (a quote, a backslash or a control character), looking
// 16 bytes at a time; when none is in b's whole 16-byte blocks, the index
// where fewer than 16 bytes remain (plainrun_amd64.s, SSE2).
//
//go:noescape
func plainRun16(b []byte) int

// specialMasks64 returns, for the 64 bytes at p, the masks of the quotes,
// the backslashes and the control characters (bit i for p[i];
// plainrun_amd64.s, SSE2).
//
//go:noescape
func specialMasks64(p *byte) (quote, backslash, ctl uint64)
