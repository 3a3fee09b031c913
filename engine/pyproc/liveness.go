package pyproc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuState is what the kernel says of a process: whether it is running
// or waiting for a CPU, and the CPU time it has used, in clock ticks.
type cpuState struct {
	runnable bool
	ticks    uint64
}

// readCPUState reads /proc/PID/stat (Linux). ok is false where there is no
// such file: the watchdog then goes by heartbeats alone.
func readCPUState(pid int) (cpuState, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return cpuState{}, false
	}
	// pid (comm) state ppid ... utime(14) stime(15): comm may hold spaces
	// and parentheses, so fields count from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return cpuState{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return cpuState{}, false
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return cpuState{}, false
	}
	return cpuState{runnable: f[0] == "R", ticks: utime + stime}, true
}

// silence decides what a heartbeat silence means. A worker silent past
// the timeout is hung unless the kernel shows it working or waiting for a
// CPU (its heartbeat thread starved by its own work holding the GIL, or
// by a loaded machine): such a worker gets up to hardLimit before it is
// killed all the same. It returns the reason to kill, or "" to wait.
type silence struct {
	last      cpuState
	haveLast  bool
	hardLimit float64 // multiple of the timeout
}

func (s *silence) judge(pid int, silentFor, timeout float64) string {
	st, ok := readCPUState(pid)
	progressed := ok && s.haveLast && st.ticks > s.last.ticks
	s.last, s.haveLast = st, ok
	switch {
	case silentFor <= timeout:
		return ""
	case ok && (st.runnable || progressed) && silentFor <= timeout*s.hardLimit:
		return ""
	case ok && (st.runnable || progressed):
		return fmt.Sprintf("heartbeat lost: silent for %.3fs while busy (past %.0fx the timeout)", silentFor, s.hardLimit)
	default:
		return fmt.Sprintf("heartbeat lost: silent for %.3fs, not running", silentFor)
	}
}
