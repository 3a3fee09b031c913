package pyproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// children lists pid's child processes (Linux: /proc/PID/task/*/children).
func children(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	var out []int
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if err != nil {
			t.Skipf("no /proc children here: %v", err)
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// gone waits for every pid to exit.
func gone(t *testing.T, pids []int, why string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("rank process %d still runs 15s after %s", pid, why)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestTensorParallelRankLoss kills one rank of a tensor-parallel worker
// while a sequence is mid-stream, a follower or rank 0, or stops a
// follower (SIGSTOP: its collectives time out): the step fails
// with a retryable *LostError, no rank of the old group survives, and the
// worker comes back as a whole group that gives the retried sequence the
// tokens of an undisturbed run.
func TestTensorParallelRankLoss(t *testing.T) {
	python(t)
	needGPUs(t, 2)
	for _, victim := range []string{"follower", "rank 0", "stopped follower"} {
		t.Run(victim, func(t *testing.T) {
			e := newEngine(t, WithTensorParallel(2), withFaults(), WithHeartbeat(100*time.Millisecond, 3*time.Second),
				WithTuning(Tuning{TPTimeout: 3 * time.Second}))
			m := load(t, e, tiny(t))
			ctx := context.Background()
			pa := prompt(1, 12)
			want := generate(t, m, 100, pa, 6)
			if _, err := m.Open(ctx, 1, pa, ""); err != nil {
				t.Fatal(err)
			}
			got := stepOne(t, m, 1, pa, nil)
			got = stepOne(t, m, 1, got, got)
			old := inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 1})
			ranks := append([]int{old.pid()}, children(t, old.pid())...)
			if len(ranks) != 2 {
				t.Fatalf("worker ranks %v, want rank 0 and one follower", ranks)
			}
			kill, sig := ranks[1], syscall.SIGKILL
			switch victim {
			case "rank 0":
				kill = ranks[0]
			case "stopped follower":
				sig = syscall.SIGSTOP
			}
			go func() {
				time.Sleep(300 * time.Millisecond)
				_ = syscall.Kill(kill, sig)
			}()
			_, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: got[len(got)-1:], Sample: true, Params: greedy}})
			var lost *LostError
			if !errors.Is(err, engine.ErrWorkerLost) || !errors.As(err, &lost) || !retry.Retryable(err) {
				t.Fatalf("step on the broken group: %v, want a *LostError", err)
			}
			t.Logf("lost: %s", lost.Reason)
			m.Free(1, "")
			gone(t, ranks, "the group lost a rank")
			waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			fresh, err := e.slots[0].current(waitCtx, e.closing)
			if err != nil || fresh == old {
				t.Fatalf("worker not replaced: %v", err)
			}
			if n := len(children(t, fresh.pid())); n != 1 {
				t.Errorf("the fresh worker has %d followers, want 1", n)
			}
			// Resumed as a batcher resumes it: the prompt plus what it had.
			resumed := append(slices.Clone(pa), got...)
			rest := generate(t, m, 2, resumed, len(want)-len(got))
			if all := append(slices.Clone(got), rest...); !slices.Equal(all, want) {
				t.Errorf("resumed on the fresh group: %v, want %v", all, want)
			}
		})
	}
}

// TestGPUReplicas starts an engine on four device ids at tensor parallel
// 2: two workers (replicas), each of two ranks, each seeing its own pair
// of devices (its CUDA_VISIBLE_DEVICES), serving the same tokens. On the
// CPU the devices go unused; the placement is what is checked.
func TestGPUReplicas(t *testing.T) {
	python(t)
	needGPUs(t, 4)
	e := newEngine(t, WithGPUs([]int{3, 2, 1, 0}), WithTensorParallel(2))
	ws := e.Workers()
	if len(ws) != 2 {
		t.Fatalf("%d workers, want 2 replicas", len(ws))
	}
	for i, want := range []string{"3,2", "1,0"} {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", ws[i].PID))
		if err != nil {
			t.Skipf("no /proc environ here: %v", err)
		}
		if !slices.Contains(strings.Split(string(env), "\x00"), "CUDA_VISIBLE_DEVICES="+want) {
			t.Errorf("worker %d: CUDA_VISIBLE_DEVICES is not %s", i, want)
		}
		if n := len(children(t, ws[i].PID)); n != 1 {
			t.Errorf("worker %d has %d followers, want 1", i, n)
		}
	}
	m := load(t, e, tiny(t))
	p := prompt(1, 9)
	fa, fb := openFeed(t, m, 1, p), openFeed(t, m, 2, p)
	if m.seqs[1].slot.idx == m.seqs[2].slot.idx {
		t.Fatalf("both sequences on worker %d", m.seqs[1].slot.idx)
	}
	a, b := stepOne(t, m, 1, fa, nil), stepOne(t, m, 2, fb, nil)
	for len(a) < 4 {
		a, b = stepOne(t, m, 1, a[len(a)-1:], a), stepOne(t, m, 2, b[len(b)-1:], b)
	}
	m.Free(1, "")
	m.Free(2, "")
	if !slices.Equal(a, b) {
		t.Errorf("the replicas disagree: %v and %v", a, b)
	}
}
