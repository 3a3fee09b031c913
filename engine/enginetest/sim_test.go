package enginetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// newModel returns a Sim and a model loaded from it, closed at cleanup.
func newModel(t *testing.T, opts ...SimOption) (*Sim, engine.Model) {
	t.Helper()
	sim, err := NewSim(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	return sim, m
}

var greedy = &engine.SamplingParams{}

// step runs one Step of a single input, failing t on error.
func step(t *testing.T, m engine.Model, id engine.SeqID, tokens []int32, params *engine.SamplingParams) int32 {
	t.Helper()
	out, err := m.Step(context.Background(), []engine.StepInput{{Seq: id, Tokens: tokens, Sample: true, Params: params}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Seq != id {
		t.Fatalf("outputs %+v for one input of sequence %d", out, id)
	}
	return out[0].Token
}

func TestNewSimRefusesBadOptions(t *testing.T) {
	for name, opts := range map[string][]SimOption{
		"negative step time":    {WithStepTime(-time.Millisecond, 0)},
		"negative per token":    {WithStepTime(0, -1)},
		"negative load time":    {WithLoadTime(-1)},
		"zero kv":               {WithKVCapacity(0)},
		"zero batch":            {WithMaxBatch(0)},
		"context 1":             {WithContextLength(1)},
		"vocab 1":               {WithVocabSize(1)},
		"eos probability 1":     {WithEOSProbability(1)},
		"eos probability < 0":   {WithEOSProbability(-0.1)},
		"eos probability, none": {WithEOS(), WithEOSProbability(0.1)},
		"eos outside vocab":     {WithVocabSize(10), WithEOS(10)},
		"eos negative":          {WithEOS(-1)},
		"all ids eos":           {WithVocabSize(2), WithEOS(0, 1)},
		"zero prefix entries":   {WithPrefixCacheEntries(0)},
	} {
		if _, err := NewSim(opts...); !errors.Is(err, engine.ErrInvalidParam) {
			t.Errorf("%s: %v; want engine.ErrInvalidParam", name, err)
		}
	}
}

func TestLoadSpec(t *testing.T) {
	sim, err := NewSim(WithMaxBatch(8), WithKVCapacity(1000), WithContextLength(100), WithVocabSize(50), WithEOS(3, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	ctx := context.Background()
	for _, bad := range []engine.ModelSpec{{}, {ID: "x", MaxBatch: -1}, {ID: "x", KVCapacity: -1}, {ID: "x", ContextLength: -1}} {
		if _, err := sim.Load(ctx, bad); !errors.Is(err, engine.ErrInvalidParam) {
			t.Errorf("Load(%+v): %v; want engine.ErrInvalidParam", bad, err)
		}
	}
	m, err := sim.Load(ctx, engine.ModelSpec{ID: "a", Path: "/nowhere"})
	if err != nil {
		t.Fatal(err)
	}
	want := engine.Info{ID: "a", Engine: "sim", ContextLength: 100, VocabSize: 50, BOS: -1, EOS: []int32{3, 4}, KVCapacity: 1000, MaxBatch: 8}
	if got := m.Info(); !infoEqual(got, want) {
		t.Errorf("Info %+v, want %+v", got, want)
	}
	m.Info().EOS[0] = 99 // a caller's copy; the model's stays
	if got := m.Info(); got.EOS[0] != 3 {
		t.Errorf("Info.EOS shared with callers: %v", got.EOS)
	}
	m2, err := sim.Load(ctx, engine.ModelSpec{ID: "b", MaxBatch: 2, KVCapacity: 10, ContextLength: 500})
	if err != nil {
		t.Fatal(err)
	}
	if got := m2.Info(); got.MaxBatch != 2 || got.KVCapacity != 10 || got.ContextLength != 100 {
		t.Errorf("overrides: %+v; want MaxBatch 2, KVCapacity 10, ContextLength 100 (never raised)", got)
	}
	if n := sim.Stats().Models; n != 2 {
		t.Errorf("Stats.Models %d, want 2", n)
	}
}

func infoEqual(a, b engine.Info) bool {
	return a.ID == b.ID && a.Engine == b.Engine && a.ContextLength == b.ContextLength && a.VocabSize == b.VocabSize &&
		a.BOS == b.BOS && slices.Equal(a.EOS, b.EOS) && a.KVCapacity == b.KVCapacity && a.MaxBatch == b.MaxBatch
}

func TestLoadHonoursContext(t *testing.T) {
	sim, err := NewSim(WithLoadTime(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := sim.Load(ctx, engine.ModelSpec{ID: "slow"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Load under a deadline: %v; want context.DeadlineExceeded", err)
	}
	if n := sim.Stats().Models; n != 0 {
		t.Errorf("a cancelled load left %d models", n)
	}
}

func TestEngineClose(t *testing.T) {
	sim, m := newModel(t)
	if _, err := m.Open(context.Background(), 1, []int32{1, 2, 3}, ""); err != nil {
		t.Fatal(err)
	}
	if err := sim.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sim.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := sim.Load(context.Background(), engine.ModelSpec{ID: "late"}); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Load after Close: %v; want engine.ErrClosed", err)
	}
	if _, err := m.Open(context.Background(), 2, []int32{1}, ""); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Open on a model of a closed engine: %v; want engine.ErrClosed", err)
	}
	if st := sim.Stats(); st.Models != 0 || st.OpenSequences != 0 || st.KVTokens != 0 {
		t.Errorf("after Close: %+v", st)
	}
}

func TestKVAccounting(t *testing.T) {
	sim, m := newModel(t, WithKVCapacity(20))
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, make([]int32, 10), ""); err != nil {
		t.Fatal(err)
	}
	kv := func(want int) {
		t.Helper()
		if got := sim.Stats().KVTokens; got != want {
			t.Errorf("KVTokens %d, want %d", got, want)
		}
	}
	kv(10)
	tok := step(t, m, 1, make([]int32, 10), greedy) // the reserved prompt: no growth
	kv(10)
	step(t, m, 1, []int32{tok}, greedy)
	kv(11)
	if _, err := m.Open(ctx, 2, make([]int32, 10), ""); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Errorf("Open of 10 with 9 free: %v; want engine.ErrOutOfMemory", err)
	}
	if _, err := m.Open(ctx, 2, make([]int32, 9), ""); err != nil {
		t.Fatalf("Open of 9 with 9 free: %v", err)
	}
	kv(20)
	_, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: []int32{5}, Sample: true, Params: greedy}})
	if !errors.Is(err, engine.ErrOutOfMemory) {
		t.Errorf("Step growing past capacity: %v; want engine.ErrOutOfMemory", err)
	}
	kv(20)
	m.Free(2, "")
	kv(11)
	m.Free(1, "save")
	kv(0)
	if st := sim.Stats(); st.OpenSequences != 0 {
		t.Errorf("OpenSequences %d after freeing all", st.OpenSequences)
	}
}

func TestStepCounters(t *testing.T) {
	sim, m := newModel(t)
	ctx := context.Background()
	for id := range engine.SeqID(3) {
		if _, err := m.Open(ctx, id, []int32{1, 2, 3, 4}, ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(id, "")
	}
	batch := []engine.StepInput{
		{Seq: 0, Tokens: []int32{1, 2, 3, 4}, Sample: true, Params: greedy},
		{Seq: 1, Tokens: []int32{1, 2}, Params: greedy},
		{Seq: 2, Tokens: []int32{1, 2, 3, 4}, Sample: true, Params: greedy},
	}
	out, err := m.Step(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Seq != 0 || out[1].Seq != 2 {
		t.Errorf("outputs %+v; want sequences 0 and 2 in order", out)
	}
	if out[0].Token != out[1].Token {
		t.Errorf("the same history gave %d and %d", out[0].Token, out[1].Token)
	}
	if out, err := m.Step(ctx, nil); err != nil || len(out) != 0 {
		t.Errorf("empty Step: %v, %v", out, err)
	}
	want := SimStats{Steps: 1, Tokens: 10, Sampled: 2, MaxBatch: 3, KVTokens: 12, OpenSequences: 3, Models: 1, Loads: 1}
	if got := sim.Stats(); got != want {
		t.Errorf("Stats %+v, want %+v", got, want)
	}
}

func TestConcurrentInfoAndStats(t *testing.T) {
	sim, m := newModel(t, WithStepTime(0, time.Microsecond))
	ctx := context.Background()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					_ = m.Info()
					_ = sim.Stats()
				}
			}
		})
	}
	if _, err := m.Open(ctx, 1, []int32{1, 2, 3}, ""); err != nil {
		t.Fatal(err)
	}
	tok := step(t, m, 1, []int32{1, 2, 3}, greedy)
	for range 200 {
		tok = step(t, m, 1, []int32{tok}, greedy)
	}
	m.Free(1, "")
	close(stop)
	wg.Wait()
}

// TestSavedEvictions: saves past the LRU bound are reported once by
// EvictedSaved, oldest first; replaced and dropped keys are not.
func TestSavedEvictions(t *testing.T) {
	_, m := newModel(t, WithPrefixCacheEntries(2))
	sk := m.(engine.SavedKV)
	ctx := context.Background()
	save := func(id engine.SeqID, key string) {
		t.Helper()
		if _, err := m.Open(ctx, id, []int32{1, 2, 3}, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: []int32{1, 2, 3}, Sample: true, Params: greedy}}); err != nil {
			t.Fatal(err)
		}
		m.Free(id, key)
	}
	save(1, "a")
	save(2, "b")
	save(3, "b") // replaces b: no eviction
	if ev := sk.EvictedSaved(); len(ev) != 0 {
		t.Fatalf("evicted %v after two keys in a cache of two", ev)
	}
	save(4, "c")
	save(5, "d")
	if ev := sk.EvictedSaved(); !slices.Equal(ev, []string{"a", "b"}) {
		t.Fatalf("EvictedSaved %v, want [a b]", ev)
	}
	if ev := sk.EvictedSaved(); len(ev) != 0 {
		t.Fatalf("EvictedSaved reported %v twice", ev)
	}
	sk.DropSaved("c")
	if ev := sk.EvictedSaved(); len(ev) != 0 {
		t.Fatalf("a dropped key reported as evicted: %v", ev)
	}
	if r, err := m.Open(ctx, 6, []int32{1, 2, 3, 4}, "c"); err != nil || r != 0 {
		t.Fatalf("Open with a dropped key: reused %d, %v; want 0, nil", r, err)
	}
	if r, err := m.Open(ctx, 7, []int32{1, 2, 9, 9}, "d"); err != nil || r != 2 {
		t.Fatalf("Open sharing 2 tokens with a save: reused %d, %v; want 2, nil", r, err)
	}
}

func TestSimWarmPaysCompileTimeOnce(t *testing.T) {
	sim, err := NewSim(WithMaxBatch(6), WithCompileTime(time.Millisecond), WithMemory(1000, 10), WithKVCapacity(100))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if info := m.Info(); info.WeightBytes != 1000 || info.KVBytes != 1000 || info.MemoryBytes() != 2000 {
		t.Fatalf("memory = %d + %d, want 1000 + 1000", info.WeightBytes, info.KVBytes)
	}
	got, err := m.(engine.Warmer).Warm(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 2, 4, 6}; !slices.Equal(got, want) {
		t.Fatalf("warmed %v, want %v", got, want)
	}
	if c := sim.Stats().ColdSteps; c != 4 {
		t.Fatalf("cold steps after Warm = %d, want 4", c)
	}
	// Every batch size now falls in a warm bucket.
	params := &engine.SamplingParams{}
	for n := 1; n <= 6; n++ {
		var batch []engine.StepInput
		for i := range n {
			id := engine.SeqID(n*10 + i)
			if _, err := m.Open(context.Background(), id, []int32{1, 2}, ""); err != nil {
				t.Fatal(err)
			}
			batch = append(batch, engine.StepInput{Seq: id, Tokens: []int32{1, 2}, Sample: true, Params: params})
		}
		if _, err := m.Step(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
		for _, in := range batch {
			m.Free(in.Seq, "")
		}
	}
	if c := sim.Stats().ColdSteps; c != 4 {
		t.Fatalf("cold steps after warm traffic = %d, want still 4", c)
	}
	if st := sim.Stats(); st.OpenSequences != 0 || st.KVTokens != 0 {
		t.Fatalf("warm left state behind: %+v", st)
	}
}

func TestSimColdStepsWithoutWarm(t *testing.T) {
	sim, err := NewSim(WithMaxBatch(4), WithCompileTime(time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(context.Background(), 1, []int32{1}, ""); err != nil {
		t.Fatal(err)
	}
	in := []engine.StepInput{{Seq: 1, Tokens: []int32{1}, Sample: true, Params: &engine.SamplingParams{}}}
	for range 3 {
		if _, err := m.Step(context.Background(), in); err != nil {
			t.Fatal(err)
		}
		in[0].Tokens = []int32{3}
	}
	if c := sim.Stats().ColdSteps; c != 1 {
		t.Fatalf("cold steps = %d, want 1 (one bucket seen)", c)
	}
	if _, err := NewSim(WithCompileTime(-1)); err == nil {
		t.Fatal("negative compile time accepted")
	}
	if _, err := NewSim(WithMemory(-1, 0)); err == nil {
		t.Fatal("negative memory accepted")
	}
}

func TestSimWorkerLoss(t *testing.T) {
	if _, err := NewSim(WithWorkerLoss(1, 0)); !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("loss rate 1: %v, want ErrInvalidParam", err)
	}
	_, m := newModel(t, WithWorkerLoss(0.3, 42))
	ctx := context.Background()
	lost, steps := 0, 0
	for id := engine.SeqID(1); id <= 50; id++ {
		if _, err := m.Open(ctx, id, []int32{5, 6, 7}, ""); err != nil {
			t.Fatal(err)
		}
		in := []engine.StepInput{{Seq: id, Tokens: []int32{5, 6, 7}, Sample: true, Params: greedy}}
		_, err := m.Step(ctx, in)
		steps++
		if err != nil {
			if !errors.Is(err, engine.ErrWorkerLost) {
				t.Fatalf("step: %v, want ErrWorkerLost", err)
			}
			lost++
			// The sequence went with the worker: stepping it fails again.
			in[0].Tokens = []int32{9}
			if _, err := m.Step(ctx, in); !errors.Is(err, engine.ErrWorkerLost) {
				t.Fatalf("stepping a lost sequence: %v, want ErrWorkerLost", err)
			}
			steps++
		}
		m.Free(id, "")
	}
	if lost < 5 || lost > 30 {
		t.Errorf("%d of %d steps lost at a rate of 0.3", lost, steps)
	}
}

func TestSimResumesAtGeneratedPosition(t *testing.T) {
	for _, resumes := range []bool{true, false} {
		var opts []SimOption
		if !resumes {
			opts = append(opts, WithoutResume())
		}
		_, m := newModel(t, opts...)
		if m.Info().Resumes != resumes {
			t.Fatalf("Info.Resumes %v, want %v", m.Info().Resumes, resumes)
		}
		ctx := context.Background()
		p := engine.SamplingParams{Temperature: 1, Seed: 3, HasSeed: true, FrequencyPenalty: 2}
		prompt := []int32{4, 8, 15, 16, 23, 42}
		run := func(id engine.SeqID, prompt []int32, n int, p engine.SamplingParams) []int32 {
			if _, err := m.Open(ctx, id, prompt, ""); err != nil {
				t.Fatal(err)
			}
			defer m.Free(id, "")
			out := []int32{step(t, m, id, prompt, &p)}
			for len(out) < n {
				out = append(out, step(t, m, id, out[len(out)-1:], &p))
			}
			return out
		}
		full := run(1, prompt, 10, p)
		p.Generated = 4
		resumed := run(2, append(slices.Clone(prompt), full[:4]...), 6, p)
		if same := slices.Equal(resumed, full[4:]); same != resumes {
			t.Errorf("resumes %v: resumed %v, uninterrupted %v", resumes, resumed, full[4:])
		}
	}
}
