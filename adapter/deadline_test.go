package adapter

import (
	"testing"
	"time"
)

func TestDeadlineMsgID(t *testing.T) {
	at := time.Date(2026, 12, 5, 3, 42, 34, 0, time.UTC)
	id := DeadlineMsgID("job-70b8bdcbd4b8a9c1", at.Add(300*time.Millisecond))
	if id != "deadline:job-70b8bdcbd4b8a9c1:1796442154" {
		t.Fatalf("Msg-Id %q", id)
	}
	for _, tc := range []struct {
		msgID string
		job   string
		at    time.Time
		ok    bool
	}{
		{id, "job-70b8bdcbd4b8a9c1", at, true},
		{"", "", time.Time{}, false},
		{"activate:job-1", "", time.Time{}, false},
		{"deadline:job-1", "", time.Time{}, false},
		{"deadline::1796442154", "", time.Time{}, false},
		{"deadline:job-1:soon", "", time.Time{}, false},
		{"seq:3", "", time.Time{}, false},
	} {
		job, at, ok := deadlineOf(tc.msgID)
		if job != tc.job || !at.Equal(tc.at) || ok != tc.ok {
			t.Errorf("deadlineOf(%q) = %q %v %v, want %q %v %v", tc.msgID, job, at, ok, tc.job, tc.at, tc.ok)
		}
	}
}
