package bus_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/internal/dev/testenv"
)

// TestDictionaryWatchAcrossNATSRestarts: the dictionary watch survives a
// NATS restart on the same storage (an announcement made afterwards
// arrives), and when NATS comes back without its JetStream storage (the
// bucket is gone) it returns an error saying so. It returned nil: its actor
// ended, and with it the whole process, with exit status 0 and no error in
// the log.
func TestDictionaryWatchAcrossNATSRestarts(t *testing.T) {
	ns := testenv.NATS(t)
	b, err := bus.Connect(context.Background(), bus.Config{URL: ns.URL()}, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keys := make(chan string, 16)
	done := make(chan error, 1)
	go func() { done <- b.WatchDictionaries(ctx, func(k string) { keys <- k }) }()
	announce := func(env string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			actx, acancel := context.WithTimeout(ctx, 2*time.Second)
			err := b.AnnounceDictionary(actx, env, "*", 1)
			acancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("announce %s: %v", env, err)
			}
		}
	}
	await := func(key string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case k := <-keys:
				if k == key {
					return
				}
			case err := <-done:
				t.Fatalf("the watch ended waiting for %s: %v", key, err)
			case <-timeout:
				t.Fatalf("no announcement of %s", key)
			}
		}
	}
	announce("before")
	await(bus.DictionaryKey("before", "*"))

	ns.Restart() // same storage: the watch goes on
	announce("after")
	await(bus.DictionaryKey("after", "*"))

	ns.Shutdown()
	if err := os.RemoveAll(ns.StoreDir()); err != nil {
		t.Fatal(err)
	}
	ns.Restart() // no storage: the bucket is gone
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), bus.BucketDictionary) {
			t.Fatalf("the watch of a bucket that is gone ended with %v; want an error naming %s", err, bus.BucketDictionary)
		}
		t.Log(err)
	case <-time.After(60 * time.Second):
		t.Fatal("the watch of a bucket that is gone neither ended nor said so")
	}
}
