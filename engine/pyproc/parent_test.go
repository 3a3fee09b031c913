package pyproc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestWorkerExitsWhenParentDies starts an engine in a child copy of this
// test binary, kills that child with SIGKILL (no Close, no cleanup) and
// checks that its worker process exits by itself.
func TestWorkerExitsWhenParentDies(t *testing.T) {
	if os.Getenv("PYPROC_TEST_PARENT") == "1" {
		parentHelper()
		return
	}
	py := python(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerExitsWhenParentDies$")
	cmd.Env = append(os.Environ(), "PYPROC_TEST_PARENT=1", "MLXSERVING_PYTHON="+py, "PYPROC_TEST_CACHE="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	pid := 0
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "worker pid "); ok {
			pid, _ = strconv.Atoi(v)
			break
		}
	}
	if pid == 0 {
		t.Fatal("the helper printed no worker pid")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("worker %d still runs 15s after its parent died", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie waiting for a reaper does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func parentHelper() {
	e, err := New(context.Background(), WithPython(os.Getenv("MLXSERVING_PYTHON")),
		WithCacheDir(os.Getenv("PYPROC_TEST_CACHE")), WithDevice("cpu"))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	p, _ := e.slots[0].current(context.Background(), e.closing)
	fmt.Printf("worker pid %d\n", p.pid())
	time.Sleep(time.Minute) // killed by the test long before
	os.Exit(1)
}
