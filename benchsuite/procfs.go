package benchsuite

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times (100 on every
// Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// procUsage is the resource use of a process tree, read from /proc.
type procUsage struct {
	// CPU is utime+stime of every live process in the tree plus the
	// cutime+cstime of children they already reaped.
	CPU time.Duration
	// OnCPU is the time the tree's live threads spent on a CPU, exact
	// (/proc/<pid>/task/*/schedstat), where utime and stime are charged
	// by whole clock ticks to whichever thread a tick finds running; ok
	// only where the kernel keeps it for every thread (onCPUOK).
	OnCPU   time.Duration
	onCPUOK bool
	// RSS is the summed resident set of the tree; PeakRSS the summed
	// VmHWM (each process's peak), in bytes.
	RSS, PeakRSS int64
}

// treeUsage reads the usage of pid and all its descendants.
func treeUsage(pid int) (procUsage, error) {
	u := procUsage{onCPUOK: true}
	for _, p := range descendants(pid) {
		cpu, err := statCPU(p)
		if err != nil {
			if p == pid {
				return u, err
			}
			continue // a child that just exited
		}
		u.CPU += cpu
		on, ok := schedCPU(p)
		u.OnCPU += on
		u.onCPUOK = u.onCPUOK && ok
		rss, hwm := statusMem(p)
		u.RSS += rss
		u.PeakRSS += hwm
	}
	return u, nil
}

// descendants returns pid and every process whose ancestry leads to it.
func descendants(pid int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := statPPID(p); err == nil {
			parent[p] = pp
		}
	}
	out := []int{pid}
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
			if _, ok := parent[q]; !ok {
				break
			}
		}
	}
	return out
}

// statFields returns the fields of /proc/<pid>/stat after the command name
// (field 3, the state, is index 0).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

func statPPID(pid int) (int, error) {
	f, err := statFields(pid)
	if err != nil || len(f) < 2 {
		return 0, fmt.Errorf("stat %d: %w", pid, err)
	}
	return strconv.Atoi(f[1])
}

// statCPU returns utime+stime+cutime+cstime (fields 14-17).
func statCPU(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 15 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	var ticks int64
	for _, s := range f[11:15] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * clockTick, nil
}

// schedCPU returns the time pid's live threads spent on a CPU, and false
// where the kernel keeps no such statistics (or a thread's could not be
// read).
func schedCPU(pid int) (time.Duration, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		total += time.Duration(ns)
	}
	return total, true
}

// busy is the tree's CPU time as exactly as it can be read: OnCPU where
// the kernel keeps it, else utime+stime.
func (u procUsage) busy() time.Duration {
	if u.onCPUOK {
		return u.OnCPU
	}
	return u.CPU
}

// statusMem returns VmRSS and VmHWM in bytes.
func statusMem(pid int) (rss, hwm int64) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, _ := strconv.ParseInt(f[0], 10, 64)
		switch name {
		case "VmRSS":
			rss = v << 10
		case "VmHWM":
			hwm = v << 10
		}
	}
	return rss, hwm
}
