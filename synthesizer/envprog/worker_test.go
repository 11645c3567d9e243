package envprog

import (
	"context"
	"io"
	"testing"
)

const testProgram = `"""A test program."""
def tools():
    return [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
def reset(seed):
    return {"system": "s", "user": "u", "state": {}}
def step(state, call):
    return {"result": "ok", "state": state}
def reward(state, transcript):
    return {"reward": 0.0}
`

// TestWorkerCloseOfARunningReset: a close read while its episode's reset
// runs drops the episode that reset makes; the worker keeps nothing for
// the calls it finished.
func TestWorkerCloseOfARunningReset(t *testing.T) {
	p, err := load(context.Background(), "p.star", []byte(testProgram), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                    string
		closeBefore, closeAfter bool // the reset's handling
		episodes                int
	}{
		{"not closed", false, false, 1},
		{"closed while the reset runs", true, false, 0},
		{"closed after the reset", false, true, 0},
		{"closed twice", true, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &workerState{fw: newFrameWriter(io.Discard), prog: p,
				episodes: map[uint64]*episode{}, cancels: map[uint64]context.CancelFunc{}, resets: map[uint64]bool{}}
			c := &call{req: request{ID: 1, Op: "reset", Episode: 7, Seed: 1}}
			w.register(c) // as serve does on reading it
			if tc.closeBefore {
				w.close(7)
			}
			w.handle(c)
			if tc.closeAfter {
				w.close(7)
			}
			if len(w.episodes) != tc.episodes || len(w.resets) != 0 || len(w.cancels) != 0 {
				t.Errorf("the worker keeps %d episodes, %d resets, %d calls; want %d, 0, 0", len(w.episodes), len(w.resets), len(w.cancels), tc.episodes)
			}
		})
	}
}
