//go:build bench

package bench

import (
	"strings"
	"testing"
	"time"
)

// These run without an API server: go test -tags bench -run '^TestReport' .

// goalLines returns the report's goal table rows (both tables).
func goalLines(report string) []string {
	var rows []string
	inGoals := false
	for _, line := range strings.Split(report, "\n") {
		switch {
		case line == "## Goals" || line == "## Earlier goals":
			inGoals = true
		case strings.HasPrefix(line, "## "):
			inGoals = false
		case inGoals && strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| Goal |"):
			rows = append(rows, line)
		}
	}
	return rows
}

// A run whose steps did not run or failed judges nothing: every goal reads
// not measured, never met (empty samples compare as zero).
func TestReportOfARunThatMeasuredNothingMeetsNoGoal(t *testing.T) {
	r := &results{started: time.Now()}
	for _, row := range goalLines(report(r, "plot.png")) {
		if strings.Contains(row, "**met**") || strings.Contains(row, "**missed**") {
			t.Errorf("a goal judged without measurements: %s", row)
		}
	}
}

// The goals judged against a floor contender read their ratio to it.
func TestReportJudgesTheScaleAgainstTheFloorContender(t *testing.T) {
	use := func(apiserver float64, wall time.Duration) cpuUse {
		return cpuUse{wall: wall, secs: map[string]float64{"kube-apiserver": apiserver, "machine": apiserver}}
	}
	r := &results{started: time.Now(), env: envInfo{cores: 2}}
	r.scale = []scaleResult{
		{row: rowFloorContender, claims: 3000, settled: 10 * time.Second, released: 4 * time.Second,
			cpuSettle: use(15, 10*time.Second), cpuRelease: use(6, 4*time.Second)}, // 5 ms per claim, 6 ms per lock
		{row: rowBL + ", 8 workers", claims: 3000, settled: 12 * time.Second, released: 4 * time.Second,
			cpuSettle: use(17.4, 12*time.Second), cpuRelease: use(9, 4*time.Second)}, // 5.8 ms per claim, 9 ms per lock
	}
	var settle, handoff string
	for _, row := range goalLines(report(r, "plot.png")) {
		switch {
		case strings.HasPrefix(row, "| Scale,"):
			settle = row
		case strings.HasPrefix(row, "| Mass hand-off"):
			handoff = row
		}
	}
	if !strings.Contains(settle, "5.8 ms per claim = 1.16×") || !strings.HasSuffix(settle, "**met** |") {
		t.Errorf("settle: %s", settle)
	}
	// 9 ms per lock is 1.5× the floor's 6: missed; and 4 s is 1.33× the floor's CPU time (6 s on 2 cores: 3 s).
	if !strings.Contains(handoff, "9.0 ms per lock = 1.50×") || !strings.Contains(handoff, "4.00 s = 1.3× the floor's CPU time") ||
		!strings.HasSuffix(handoff, "**missed** |") {
		t.Errorf("mass hand-off: %s", handoff)
	}
}
