package pyproc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestAdapterWarmEveryWorker: WarmAdapter makes an adapter resident on
// both workers of two, so that a sequence of it on either opens without a
// load (its file is moved away first, and they still decode the merged
// checkpoint's tokens); a warm-up beside serving sequences is safe. A
// killed worker's replacement holds the pinned adapter again before it
// serves (the unpinned one not), and its sequences need no load there
// either.
func TestAdapterWarmEveryWorker(t *testing.T) {
	e := newEngine(t, WithWorkers(2))
	c := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 71})
	dy := filepath.Join(t.TempDir(), "y")
	if err := testmodel.WriteAdapter(dy, testmodel.Tiny(), testmodel.Adapter{Rank: 4, Seed: 72}); err != nil {
		t.Fatal(err)
	}
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base, AdapterSlots: 2})
	ctx := context.Background()
	if _, err := m.AddAdapter(ctx, engine.AdapterSpec{Name: "pin", Path: c.adapter, Pinned: true}); err != nil {
		t.Fatal(err)
	}
	addAdapter(t, m, "y", dy)
	pin, y := m.adapters["pin"].key, m.adapters["y"].key
	p := prompt(8, 11)
	want := generate(t, loadSpec(t, e, engine.ModelSpec{ID: "merged", Path: c.merged}), 1, p, 8)
	if err := m.WarmAdapter(ctx, "nope"); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("WarmAdapter of an adapter not served: %v, want ErrModelNotFound", err)
	}
	if err := m.WarmAdapter(ctx, "pin"); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := residentKeys(t, e, m, i); !slices.Contains(got, pin) {
			t.Fatalf("worker %d holds %v after the warm-up, not %s", i, got, pin)
		}
	}
	file := m.adapters["pin"].load["file"].(string)
	away := func() func() { // a load of pin fails from now until the returned func runs
		if err := os.Rename(file, file+".away"); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := os.Rename(file+".away", file); err != nil {
				t.Fatal(err)
			}
		}
	}
	back := away()
	warmed := make(chan error, 1)
	go func() { warmed <- m.WarmAdapter(ctx, "y") }()
	for i, got := range onBothWorkers(t, m, p, 8, "pin") {
		if !slices.Equal(got, want) {
			t.Errorf("worker %d, warmed: %v, merged %v", i, got, want)
		}
	}
	if err := <-warmed; err != nil {
		t.Fatalf("warming y beside pin's sequences: %v", err)
	}
	for i := range 2 {
		if got := residentKeys(t, e, m, i); !slices.Contains(got, y) {
			t.Errorf("worker %d holds %v after y's warm-up", i, got)
		}
	}
	back()

	old, err := e.slots[0].current(ctx, e.closing)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(old.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.dead
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := e.slots[0].current(waitCtx, e.closing); err != nil {
		t.Fatalf("worker 0 not replaced: %v", err)
	}
	if got := residentKeys(t, e, m, 0); !slices.Equal(got, []string{pin}) {
		t.Fatalf("the replacement worker holds %v; want the pinned adapter alone (%s)", got, pin)
	}
	defer away()()
	for i, got := range onBothWorkers(t, m, p, 8, "pin") {
		if !slices.Equal(got, want) {
			t.Errorf("worker %d after the restart: %v, merged %v", i, got, want)
		}
	}
}

// onBothWorkers opens two sequences of adapter for prompt, one on each of
// two workers (routing spreads them: both hold the adapter), decodes n
// greedy tokens for each in the same steps, frees them and returns their
// tokens by worker.
func onBothWorkers(t *testing.T, m *Model, p []int32, n int, adapter string) [2][]int32 {
	t.Helper()
	ctx := context.Background()
	for _, id := range []engine.SeqID{1, 2} {
		if _, err := m.OpenAdapter(ctx, id, p, "", adapter); err != nil {
			t.Fatalf("open %d of %s: %v", id, adapter, err)
		}
		defer m.Free(id, "")
	}
	if m.seqs[1].slot == m.seqs[2].slot {
		t.Fatalf("both sequences of %s went to worker %d", adapter, m.seqs[1].slot.idx)
	}
	feed := [][]int32{p, p}
	var got [2][]int32
	for range n {
		outs, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed[0], Sample: true, Params: greedy},
			{Seq: 2, Tokens: feed[1], Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range outs {
			got[m.seqs[engine.SeqID(i+1)].slot.idx] = append(got[m.seqs[engine.SeqID(i+1)].slot.idx], o.Token)
			feed[i] = []int32{o.Token}
		}
	}
	return got
}

// residentKeys are the adapter keys worker i reports resident for m.
func residentKeys(t *testing.T, e *Engine, m *Model, i int) []string {
	t.Helper()
	var keys []string
	for _, k := range workerStatsOf(t, e, m, i)["adapters"].([]any) {
		keys = append(keys, k.(string))
	}
	slices.Sort(keys)
	return keys
}

// TestAdapterWarmSlowWorker: a warm-up waiting on a busy worker holds
// nothing the other workers need: an adapter resident on the other
// worker opens, decodes and frees there while the warm-up still waits.
func TestAdapterWarmSlowWorker(t *testing.T) {
	e := newEngine(t, WithWorkers(2), withFaults())
	c := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 71})
	dy := filepath.Join(t.TempDir(), "y")
	if err := testmodel.WriteAdapter(dy, testmodel.Tiny(), testmodel.Adapter{Rank: 4, Seed: 72}); err != nil {
		t.Fatal(err)
	}
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base, AdapterSlots: 2})
	addAdapter(t, m, "x", c.adapter)
	addAdapter(t, m, "y", dy)
	ctx := context.Background()
	p := prompt(8, 11)
	if _, err := m.OpenAdapter(ctx, 1, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	w := m.seqs[1].slot.idx
	inject(t, e, 1-w, map[string]any{"kind": "spin", "seconds": 10}) // the other worker is busy for 10 s
	warmed := make(chan error, 1)
	go func() { warmed <- m.WarmAdapter(ctx, "y") }()
	for pendingLoads(m) == 0 { // the warm-up's loads are out
		select {
		case err := <-warmed:
			t.Fatalf("the warm-up ended (%v) with no load seen pending: it held the slot table throughout", err)
		default:
			runtime.Gosched()
		}
	}
	if _, err := m.OpenAdapter(ctx, 2, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	if m.seqs[2].slot.idx != w {
		t.Fatalf("x's second sequence went to worker %d, want %d where x is resident", m.seqs[2].slot.idx, w)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: p, Sample: true, Params: &engine.SamplingParams{}}}); err != nil {
		t.Fatal(err)
	}
	m.Free(2, "")
	m.Free(1, "")
	select {
	case err := <-warmed:
		t.Fatalf("the warm-up ended (%v) before the busy worker could answer: the test raced", err)
	default: // still waiting on the busy worker, and the other one served meanwhile
	}
	if err := <-warmed; err != nil {
		t.Fatal(err)
	}
}

// pendingLoads counts the slots a warm-up is loading, on every worker.
func pendingLoads(m *Model) int {
	m.smu.Lock()
	defer m.smu.Unlock()
	n := 0
	for _, st := range m.resident {
		for _, s := range st {
			if s.pending != nil {
				n++
			}
		}
	}
	return n
}

// TestAdapterWarmKeepsResident: warming an adapter a worker holds already
// counts as using it, so the next adapter to load evicts another one.
func TestAdapterWarmKeepsResident(t *testing.T) {
	e := newEngine(t)
	c := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 81})
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base, AdapterSlots: 2})
	dirs := map[string]string{"x": c.adapter}
	for i, name := range []string{"y", "z"} {
		dirs[name] = filepath.Join(t.TempDir(), name)
		if err := testmodel.WriteAdapter(dirs[name], testmodel.Tiny(), testmodel.Adapter{Rank: 4, Seed: int64(82 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"x", "y", "z"} {
		addAdapter(t, m, name, dirs[name])
	}
	ctx := context.Background()
	for i, name := range []string{"x", "y"} { // x, then y: x is the least recently used
		if _, err := m.OpenAdapter(ctx, engine.SeqID(i+1), prompt(8, 3), "", name); err != nil {
			t.Fatal(err)
		}
		m.Free(engine.SeqID(i+1), "")
	}
	if err := m.WarmAdapter(ctx, "x"); err != nil { // resident already: loads nothing, counts as used
		t.Fatal(err)
	}
	if _, err := m.OpenAdapter(ctx, 3, prompt(8, 3), "", "z"); err != nil {
		t.Fatal(err)
	}
	m.Free(3, "")
	keys := residentKeys(t, e, m, 0)
	if len(keys) != 2 || !strings.HasPrefix(keys[0], "x#") || !strings.HasPrefix(keys[1], "z#") {
		t.Fatalf("resident after z loaded: %v, want x (warmed) and z, y evicted", keys)
	}
}
