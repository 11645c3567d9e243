// Package shareddata locates the read-only third-party data set that lives
// beside the repository clone (../shared/data, see shared/data/README.md) so
// tests can read it in place.
//
// The directory is found, in order, from:
//
//  1. the TRACE_SHARED_DATA environment variable, which names the data
//     directory itself (the one holding tau2/ and trace-release/);
//  2. walking up from the working directory (a test runs in its package
//     directory) and taking the first ancestor A for which A/shared/data is a
//     directory. With the clone at /work/main this finds /work/shared/data.
package shareddata

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// EnvVar overrides the search: it names the shared data directory.
const EnvVar = "TRACE_SHARED_DATA"

// Lookup returns the absolute path of shared/data/<sub> (sub may be "" for the
// data directory itself) or an error saying where it looked.
func Lookup(sub string) (string, error) {
	if env := os.Getenv(EnvVar); env != "" {
		p := filepath.Join(env, filepath.FromSlash(sub))
		if isDir(p) {
			return filepath.Abs(p)
		}
		return "", fmt.Errorf("%s=%s but %s is not a directory", EnvVar, env, p)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; {
		data := filepath.Join(dir, "shared", "data")
		if isDir(data) {
			p := filepath.Join(data, filepath.FromSlash(sub))
			if isDir(p) {
				return p, nil
			}
			return "", fmt.Errorf("found %s but it has no %s", data, sub)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", errors.New("no shared/data directory beside any ancestor of " + wd + " (set " + EnvVar + " to point at it)")
}

// Dir returns the path of shared/data/<sub>, or skips the test with a message
// naming what is missing when the directory is absent. CI always has
// ../shared beside the clone, so a skip there means a broken checkout.
func Dir(t testing.TB, sub string) string {
	t.Helper()
	p, err := Lookup(sub)
	if err != nil {
		t.Skipf("../shared/data/%s is absent: %v", sub, err)
	}
	return p
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
