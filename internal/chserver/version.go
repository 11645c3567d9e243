package chserver

import (
	"fmt"
	"regexp"
	"strconv"
)

// Version is a ClickHouse release number such as 18.16.1 or 24.8.4.13.
// The zero Version means "unknown".
type Version struct {
	Major, Minor, Patch, Build int
}

// versionWordRe and versionRe find a dotted release number:
// "ClickHouse server version 24.8.4.13 (official build).",
// "ClickHouse client version 18.16.1.", "18.16.1+ds-7.3+b2" (dpkg), "18.16.1".
// A number right after "version" wins over one elsewhere in the text.
var (
	versionWordRe = regexp.MustCompile(`(?i)\bversion\s+v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?(?:\.(\d{1,9}))?`)
	versionRe     = regexp.MustCompile(`\b(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?(?:\.(\d{1,9}))?`)
)

// ParseVersion extracts a ClickHouse version from the output of
// `clickhouse-server --version`, `clickhouse-client --version`,
// `SELECT version()` or a Debian package version.
func ParseVersion(s string) (Version, error) {
	m := versionWordRe.FindStringSubmatch(s)
	if m == nil {
		m = versionRe.FindStringSubmatch(s)
	}
	if m == nil {
		return Version{}, fmt.Errorf("chserver: no ClickHouse version in %q", s)
	}
	var v Version
	for i, p := range []*int{&v.Major, &v.Minor, &v.Patch, &v.Build} {
		if m[i+1] == "" {
			continue
		}
		n, err := strconv.Atoi(m[i+1])
		if err != nil {
			return Version{}, fmt.Errorf("chserver: bad version %q: %w", s, err)
		}
		*p = n
	}
	if v.Major == 0 {
		return Version{}, fmt.Errorf("chserver: no ClickHouse version in %q", s)
	}
	return v, nil
}

// IsZero reports whether the version is unknown.
func (v Version) IsZero() bool { return v == Version{} }

// AtLeast reports whether v >= major.minor. An unknown version is at least
// nothing.
func (v Version) AtLeast(major, minor int) bool {
	if v.Major != major {
		return v.Major > major
	}
	return v.Minor >= minor
}

// String formats the version as ClickHouse does ("18.16.1", "24.8.4.13");
// an unknown version is "unknown".
func (v Version) String() string {
	switch {
	case v.IsZero():
		return "unknown"
	case v.Build != 0:
		return fmt.Sprintf("%d.%d.%d.%d", v.Major, v.Minor, v.Patch, v.Build)
	default:
		return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	}
}
