package window

import (
	"testing"
	"time"
)

// FuzzCalendar draws up to four windows from the fuzzer's bytes (genCase:
// one byte per choice) and adds one whose schedule is the fuzzer's string,
// in Europe/Berlin: Compile must refuse what it cannot evaluate without
// panicking, a refused calendar is frozen for good, and an admitted one
// changes only at the edges it reports. The seed corpus in
// testdata/fuzz/FuzzCalendar holds the daylight-saving days, a schedule
// that never fires, and strings robfig's parser mishandles (a CRON_TZ=
// without a space panics it).
func FuzzCalendar(f *testing.F) {
	f.Add([]byte{}, "30 2 * * *")
	f.Fuzz(func(t *testing.T, data []byte, schedule string) {
		ch := &byteChooser{data: data}
		ws, at := genCase(ch, genDurations)
		ws = append(ws, Window{Kind: Deny, Schedule: schedule, Duration: time.Duration(1+ch.intn(48*60)) * time.Minute, TimeZone: "Europe/Berlin"})
		cal, err := Compile(ws)
		if err != nil {
			if s := cal.At(at); s.Open || s.Changes || len(s.Active) != 0 {
				t.Fatalf("a calendar Compile refused (%v) is not frozen for good: %+v", err, s)
			}
			return
		}
		if _, err := checkEdges(cal, at, ch); err != nil {
			t.Fatalf("%v\n%s", err, describe(ws, at))
		}
	})
}
