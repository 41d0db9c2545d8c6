//go:build bench

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cpuSeconds is the CPU time (user + system) used so far by the API server,
// etcd, the manager binary and this process (the operator and the
// contenders), so that a window's difference shows what was busy. Only the
// processes this process started count: other engineers' test clusters may
// run beside it.
func cpuSeconds() map[string]float64 {
	out := map[string]float64{"kube-apiserver": 0, "etcd": 0, "manager": 0, "harness (operator + contenders)": procCPU(os.Getpid()), "machine": machineCPU()}
	self := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		comm := s[strings.IndexByte(s, '(')+1 : strings.LastIndexByte(s, ')')]
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if _, ok := out[comm]; ok && fields[1] == self {
			pid, _ := strconv.Atoi(filepath.Base(dir))
			out[comm] += procCPU(pid)
		}
	}
	return out
}

// machineCPU is the busy time of all cores since boot, in seconds.
func machineCPU() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(raw), "\n", 2)[0]) // cpu user nice system idle iowait irq softirq steal
	busy := 0.0
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseFloat(f[i], 64)
		busy += v
	}
	return busy / 100
}

// procCPU reads utime + stime of a process from /proc, in seconds.
func procCPU(pid int) float64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// cpuUse is the CPU used in a window, as a share of the window's wall time
// (2.0 = both cores busy); other processes are the
// other engineers' work on the shared machine.
type cpuUse struct {
	wall time.Duration
	secs map[string]float64
}

func cpuSince(start map[string]float64, t0 time.Time) cpuUse {
	u := cpuUse{wall: time.Since(t0), secs: map[string]float64{}}
	for k, v := range cpuSeconds() {
		u.secs[k] = v - start[k]
	}
	return u
}

// others is the share of the cores (2.00 = both) that processes other than
// the load's used in the window: other engineers' work on the machine.
func (u cpuUse) others() float64 {
	return (u.secs["machine"] - u.busy()) / u.wall.Seconds()
}

func (u cpuUse) String() string {
	var parts []string
	for _, k := range []string{"kube-apiserver", "etcd", "manager", "harness (operator + contenders)"} {
		if k == "manager" && u.secs[k] == 0 {
			continue // no manager binary ran
		}
		name := k
		if k == "manager" {
			name = "manager binary"
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", name, u.secs[k]/u.wall.Seconds()))
	}
	return fmt.Sprintf("%s; other processes on the machine %.2f", strings.Join(parts, ", "), u.others())
}

// busy is the CPU time the API server, etcd, the manager binary and the
// harness used in the window, in seconds: the work of the load measured.
func (u cpuUse) busy() float64 {
	return u.secs["kube-apiserver"] + u.secs["etcd"] + u.secs["manager"] + u.secs["harness (operator + contenders)"]
}
