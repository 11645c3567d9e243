//go:build !amd64

package schemas

// plainRun16 is plainrun_amd64.s's scan on other architectures: it skips
// nothing and leaves the scan to plainRun's 8-byte loop.
func plainRun16(b []byte) int { return 0 }
