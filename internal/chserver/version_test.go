package chserver

import "testing"

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in      string
		want    Version
		wantErr bool
	}{
		{in: "18.16.1", want: Version{18, 16, 1, 0}},
		{in: "18.16.1\n", want: Version{18, 16, 1, 0}},
		{in: "ClickHouse client version 18.16.1.", want: Version{18, 16, 1, 0}},
		{in: "18.16.1+ds-7.3+b2", want: Version{18, 16, 1, 0}},
		{in: "ClickHouse server version 24.8.4.13 (official build).", want: Version{24, 8, 4, 13}},
		{in: "ClickHouse local version 25.3.1.2703 (official build).\n", want: Version{25, 3, 1, 2703}},
		{in: "Warning: 1.2 GiB free\nClickHouse server version 23.3.1.1 (official build).", want: Version{23, 3, 1, 1}},
		{in: "26.7.3.1", want: Version{26, 7, 3, 1}},
		{in: "21.8", want: Version{21, 8, 0, 0}},
		{in: "Unknown option specified: version", wantErr: true},
		{in: "", wantErr: true},
		{in: "0.0.0", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseVersion(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseVersion(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestVersionAtLeastAndString(t *testing.T) {
	tests := []struct {
		v            Version
		major, minor int
		want         bool
	}{
		{Version{18, 16, 1, 0}, 18, 12, true},
		{Version{18, 16, 1, 0}, 18, 16, true},
		{Version{18, 16, 1, 0}, 18, 17, false},
		{Version{18, 16, 1, 0}, 19, 3, false},
		{Version{19, 3, 0, 0}, 19, 3, true},
		{Version{24, 1, 0, 0}, 22, 1, true},
		{Version{}, 18, 0, false},
	}
	for _, tt := range tests {
		if got := tt.v.AtLeast(tt.major, tt.minor); got != tt.want {
			t.Errorf("%v.AtLeast(%d, %d) = %v, want %v", tt.v, tt.major, tt.minor, got, tt.want)
		}
	}
	for v, want := range map[Version]string{
		{18, 16, 1, 0}:   "18.16.1",
		{24, 8, 4, 13}:   "24.8.4.13",
		{}:               "unknown",
		{21, 8, 0, 0}:    "21.8.0",
		{26, 7, 3, 1003}: "26.7.3.1003",
	} {
		if got := v.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", v, got, want)
		}
	}
}
