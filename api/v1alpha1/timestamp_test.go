package v1alpha1_test

import (
	"encoding/json"
	"testing"
	"time"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

func TestTimestampDecodesEveryRFC3339Form(t *testing.T) {
	want := time.Date(2026, 11, 30, 22, 45, 0, 0, time.UTC)
	for in, at := range map[string]time.Time{
		`"2026-11-30T22:45:00Z"`:                want,
		`"2026-11-30T22:45:00.000000Z"`:         want,
		`"2026-11-30T22:45:00.5Z"`:              want.Add(500 * time.Millisecond),
		`"2026-11-30T22:45:00.123456789Z"`:      want.Add(123456789),
		`"2026-12-01T12:45:00+14:00"`:           want,
		`"2026-11-30T12:45:00.000-10:00"`:       want,
		`"2026-11-30T22:45:00.000000000+00:00"`: want,
	} {
		var ts buildlockv1.Timestamp
		if err := json.Unmarshal([]byte(in), &ts); err != nil || !ts.Equal(at) {
			t.Errorf("%s: got %v, %v; want %v", in, ts.Time, err, at)
		}
	}
	for _, in := range []string{`"yesterday"`, `"2026-11-30"`, `"2026-11-30T22:45:00"`, `42`} {
		var ts buildlockv1.Timestamp
		if err := json.Unmarshal([]byte(in), &ts); err == nil {
			t.Errorf("%s decoded to %v", in, ts.Time)
		}
	}
}

func TestTimestampEncodesInUTCWithMicroseconds(t *testing.T) {
	ts := buildlockv1.NewTimestamp(time.Date(2026, 12, 1, 12, 45, 0, 123456789, time.FixedZone("", 14*3600)))
	b, err := json.Marshal(struct {
		At    *buildlockv1.Timestamp `json:"at"`
		Unset *buildlockv1.Timestamp `json:"unset,omitempty"`
	}{At: ts})
	if err != nil || string(b) != `{"at":"2026-11-30T22:45:00.123456Z"}` {
		t.Errorf("got %s, %v", b, err)
	}
	var zero buildlockv1.Timestamp
	if b, _ := json.Marshal(zero); string(b) != "null" {
		t.Errorf("zero: got %s", b)
	}
	if got := ts.DeepCopy(); !got.Equal(ts.Time) {
		t.Errorf("DeepCopy: got %v", got)
	}
}
