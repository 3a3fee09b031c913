package enginetest

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

func TestSimConformance(t *testing.T) {
	sim, err := NewSim(WithVocabSize(500), WithContextLength(512), WithMaxBatch(8))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	Run(t, sim, "")
	t.Logf("the suite ran %d steps, %d tokens fed, %d sampled", sim.Stats().Steps, sim.Stats().Tokens, sim.Stats().Sampled)
	if st := sim.Stats(); st.OpenSequences != 0 || st.KVTokens != 0 || st.Models != 0 {
		t.Errorf("after the suite: %+v; want no open sequences, KV or models", st)
	}
}

// TestSimConformancePaged runs the suite on a paged simulated model:
// blocks of 16 tokens, taken as sequences are fed.
func TestSimConformancePaged(t *testing.T) {
	sim, err := NewSim(WithVocabSize(500), WithContextLength(512), WithMaxBatch(8), WithBlockSize(16))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	Run(t, sim, "")
	if st := sim.Stats(); st.OpenSequences != 0 || st.KVTokens != 0 || st.Models != 0 {
		t.Errorf("after the suite: %+v; want no open sequences, KV or models", st)
	}
}

func TestSimConformanceDefaults(t *testing.T) {
	sim, err := NewSim()
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	Run(t, sim, t.TempDir())
}

// recorder is a testing.TB that records failures instead of failing the
// test; Fatal ends the calling goroutine as testing.T's does.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	logs   []string
}

func (r *recorder) Helper() {}
func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recorder) Errorf(format string, args ...any) { r.Logf(format, args...); r.fail() }
func (r *recorder) Error(args ...any)                 { r.Logf("%v", args...); r.fail() }
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Error(args...); runtime.Goexit() }
func (r *recorder) FailNow()                          { r.fail(); runtime.Goexit() }
func (r *recorder) Failed() bool                      { r.mu.Lock(); defer r.mu.Unlock(); return r.failed }
func (r *recorder) fail()                             { r.mu.Lock(); r.failed = true; r.mu.Unlock() }

// runCheck runs one check against m with a recorder and reports whether
// it failed, and with what first message.
func runCheck(t *testing.T, check func(testing.TB, *suite), m, small engine.Model) (bool, string) {
	t.Helper()
	r := &recorder{TB: t}
	s := &suite{ctx: context.Background(), m: m, small: small, info: m.Info()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r, s)
	}()
	<-done
	first := ""
	if len(r.logs) > 0 {
		first = r.logs[0]
	}
	return r.Failed(), first
}

// perturbing is a broken model: a token sampled in a batch of more than
// one sequence is off by one.
type perturbing struct{ engine.Model }

func (p perturbing) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	out, err := p.Model.Step(ctx, batch)
	if len(batch) > 1 {
		for i := range out {
			out[i].Token = (out[i].Token + 1) % int32(p.Info().VocabSize)
		}
	}
	return out, err
}

// liar is a broken model: it reports limits it does not enforce.
type liar struct {
	engine.Model
	info engine.Info
}

func (l liar) Info() engine.Info { return l.info }

// seedless is a broken model: every seeded sequence samples with seed 1.
type seedless struct{ engine.Model }

func (s seedless) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	b := slices.Clone(batch)
	for i := range b {
		if b[i].Params != nil && b[i].Params.HasSeed {
			p := *b[i].Params
			p.Seed = 1
			b[i].Params = &p
		}
	}
	return s.Model.Step(ctx, b)
}

// generatedIgnored is a broken model: it reports Info.Resumes but ignores
// SamplingParams.Generated (a simulated model loaded WithoutResume).
type generatedIgnored struct{ engine.Model }

func (g generatedIgnored) Info() engine.Info {
	i := g.Model.Info()
	i.Resumes = true
	return i
}

// deaf is a broken model: it ignores the Step's context.
type deaf struct{ engine.Model }

func (d deaf) Step(_ context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	return d.Model.Step(context.Background(), batch)
}

// forgetful is a broken model: it ignores prefix keys' saved tokens and
// reports reuse of the whole saved prefix anyway.
type forgetful struct{ engine.Model }

func (f forgetful) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	r, err := f.Model.Open(ctx, id, prompt, key)
	if r > 0 {
		f.Model.Free(id, "")
		if _, err := f.Model.Open(ctx, id, prompt[r:], ""); err != nil {
			return 0, err
		}
	}
	return r, err
}

// prefixOnly is a broken model: it reuses saved KV only when the saved
// tokens are a whole prefix of the prompt, as engines once did.
type prefixOnly struct {
	engine.Model
	fed   map[engine.SeqID][]int32
	saved map[string][]int32
}

func newPrefixOnly(m engine.Model) *prefixOnly {
	return &prefixOnly{Model: m, fed: map[engine.SeqID][]int32{}, saved: map[string][]int32{}}
}

func (p *prefixOnly) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	if s, ok := p.saved[key]; !ok || len(s) > len(prompt) || !slices.Equal(s, prompt[:len(s)]) {
		key = ""
	}
	r, err := p.Model.Open(ctx, id, prompt, key)
	if err == nil {
		p.fed[id] = slices.Clone(prompt[:r])
	}
	return r, err
}

func (p *prefixOnly) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	for _, in := range batch {
		p.fed[in.Seq] = append(p.fed[in.Seq], in.Tokens...)
	}
	return p.Model.Step(ctx, batch)
}

func (p *prefixOnly) Free(id engine.SeqID, key string) {
	if key != "" {
		p.saved[key] = p.fed[id]
	}
	delete(p.fed, id)
	p.Model.Free(id, key)
}

func TestSuiteFailsBrokenEngines(t *testing.T) {
	sim, err := NewSim(WithVocabSize(300), WithContextLength(256))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	ctx := context.Background()
	m, err := sim.Load(ctx, engine.ModelSpec{ID: mainID})
	if err != nil {
		t.Fatal(err)
	}
	small, err := sim.Load(ctx, smallSpec(""))
	if err != nil {
		t.Fatal(err)
	}
	// A model loaded as if the spec's limits were not there.
	unlimited, err := sim.Load(ctx, engine.ModelSpec{ID: smallID})
	if err != nil {
		t.Fatal(err)
	}
	noResume, err := NewSim(WithVocabSize(300), WithContextLength(256), WithoutResume())
	if err != nil {
		t.Fatal(err)
	}
	defer noResume.Close()
	ignoring, err := noResume.Load(ctx, engine.ModelSpec{ID: mainID})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name          string
		check         func(testing.TB, *suite)
		broken, small engine.Model
	}{
		{"resume/generated_ignored", checkResume, generatedIgnored{ignoring}, small},
		{"batch_invariance/perturbing", checkBatchInvariance, perturbing{m}, small},
		{"join_leave/perturbing", checkJoinLeave, perturbing{m}, small},
		{"chunked_prefill/perturbing", checkChunkedPrefill, perturbing{m}, small},
		{"seeded_sampling/seedless", checkSeededSampling, seedless{m}, small},
		{"cancellation/deaf", checkCancellation, deaf{m}, small},
		{"prefix_reuse/forgetful", checkPrefixReuse, forgetful{m}, small},
		{"partial_prefix_reuse/prefix_only", checkPartialPrefixReuse, newPrefixOnly(m), small},
		{"load/limits_ignored", checkLoad, m, unlimited},
		{"capacity/limits_unenforced", checkCapacity, m, liar{unlimited, small.Info()}},
		{"max_batch/limits_unenforced", checkMaxBatch, m, liar{unlimited, small.Info()}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if failed, msg := runCheck(t, c.check, m, small); failed {
				t.Fatalf("the check fails on the sound engine: %s", msg)
			}
			failed, msg := runCheck(t, c.check, c.broken, c.small)
			if !failed {
				t.Fatal("the check passes a broken engine")
			}
			t.Logf("broken engine caught: %s", msg)
		})
	}
	if st := sim.Stats(); st.OpenSequences != 0 {
		t.Errorf("%d sequences left open by the checks", st.OpenSequences)
	}
}

// perturbingEngine is a broken engine whose models perturb batched tokens.
type perturbingEngine struct{ *Sim }

func (e perturbingEngine) Load(ctx context.Context, spec engine.ModelSpec) (engine.Model, error) {
	m, err := e.Sim.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return perturbing{m}, nil
}

func TestSuiteFailsPerturbingEngine(t *testing.T) {
	sim, err := NewSim(WithVocabSize(300))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	s, err := loadModels(context.Background(), perturbingEngine{sim}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = s.m.Close(), s.small.Close() }()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		checkBatchInvariance(r, s)
	}()
	<-done
	if !r.Failed() {
		t.Fatal("batch_invariance passes an engine whose batched tokens differ from lone ones")
	}
	t.Logf("caught: %s", r.logs[0])
}

// TestSimPipelineConformance runs the pipelining suite on the simulated
// engine: unpaged and paged, with steps that take no time and with steps
// that take long enough for FreeBlocks' timing to be checked.
func TestSimPipelineConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []SimOption
	}{
		{"instant", nil},
		{"paged", []SimOption{WithBlockSize(16)}},
		{"paged_timed", []SimOption{WithBlockSize(16), WithStepTime(2*time.Millisecond, 20*time.Microsecond)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sim, err := NewSim(append([]SimOption{WithVocabSize(500), WithContextLength(512), WithMaxBatch(8)}, c.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			RunPipeline(t, sim, "")
			st := sim.Stats()
			if st.OpenSequences != 0 || st.KVTokens != 0 || st.Models != 0 {
				t.Errorf("after the suite: %+v; want no open sequences, KV or models", st)
			}
			if st.Pipelined == 0 || st.Wasted == 0 {
				t.Errorf("after the suite: %d steps pipelined, %d rows wasted; want some of each", st.Pipelined, st.Wasted)
			}
		})
	}
}
