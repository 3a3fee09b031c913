package batcher_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type rig struct {
	sim   *enginetest.Sim
	model engine.Model
	queue *scheduler.PriorityScheduler[*batcher.Sequence]
	b     *batcher.ContinuousBatcher
}

func newRig(t testing.TB, simOpts []enginetest.SimOption, qOpts []scheduler.Option, bOpts ...batcher.Option) *rig {
	t.Helper()
	sim, m := simModel(t, simOpts...)
	return newRigModel(t, sim, m, qOpts, bOpts...)
}

// simModel is a simulated engine and its model "sim" loaded; the caller
// closes the engine (newRigModel does).
func simModel(t testing.TB, opts ...enginetest.SimOption) (*enginetest.Sim, engine.Model) {
	t.Helper()
	sim, err := enginetest.NewSim(opts...)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	return sim, m
}

func newRigModel(t testing.TB, sim *enginetest.Sim, m engine.Model, qOpts []scheduler.Option, bOpts ...batcher.Option) *rig {
	t.Helper()
	q, err := scheduler.New[*batcher.Sequence](qOpts...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := batcher.New(m, q, bOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		q.Close()
		_ = sim.Close()
	})
	return &rig{sim: sim, model: m, queue: q, b: b}
}

func (r *rig) submit(t testing.TB, seq *batcher.Sequence) *batcher.Entry {
	t.Helper()
	if seq.Tier == 0 {
		seq.Tier = api.Normal
	}
	e := &batcher.Entry{Value: seq, Tier: seq.Tier, Cost: len(seq.Prompt) + seq.MaxTokens}
	if err := r.queue.Push(e); err != nil {
		t.Fatal(err)
	}
	return e
}

type result struct {
	tokens []int32
	finish api.FinishReason
	usage  *api.Usage
	err    error
}

func collect(seq *batcher.Sequence) result {
	return collectWith(context.Background(), seq, nil)
}

// collectWith reads seq's stream to its end, calling onToken (when not
// nil) with the tokens received so far after each token. It gives up
// when ctx ends (the result's err is then ctx's).
func collectWith(ctx context.Context, seq *batcher.Sequence, onToken func(n int)) result {
	var r result
	for {
		c, err := seq.Recv(ctx)
		if errors.Is(err, batcher.ErrStreamDone) {
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		if c.HasToken {
			r.tokens = append(r.tokens, c.Token)
			if onToken != nil {
				onToken(len(r.tokens))
			}
		}
		if c.Finish != "" {
			r.finish, r.usage = c.Finish, c.Usage
		}
	}
}

func prompt(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*31+i*7)%150 + 1)
	}
	return p
}

// alone runs prompt through the model directly, one sequence, greedy: the
// reference every batched run must reproduce.
func alone(t *testing.T, p []int32, n int) []int32 {
	t.Helper()
	sim, err := enginetest.NewSim()
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "ref"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, p, ""); err != nil {
		t.Fatal(err)
	}
	params := &engine.SamplingParams{}
	feed := p
	var out []int32
	for len(out) < n {
		res, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed, Sample: true, Params: params}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res[0].Token)
		feed = out[len(out)-1:]
	}
	return out
}

func TestBatchedTokensMatchAlone(t *testing.T) {
	// A small token budget forces chunked prefill mixed with decode, and
	// different lengths make sequences join and leave at different steps.
	r := newRig(t, nil, nil, batcher.WithTokenBudget(16), batcher.WithMaxBatch(4))
	var seqs []*batcher.Sequence
	for i := range 10 {
		s := &batcher.Sequence{Prompt: prompt(i, 5+i*9), MaxTokens: 3 + i*2, IgnoreEOS: true}
		r.submit(t, s)
		seqs = append(seqs, s)
	}
	for i, s := range seqs {
		got := collect(s)
		if got.err != nil {
			t.Fatalf("seq %d: %v", i, got.err)
		}
		want := alone(t, s.Prompt, s.MaxTokens)
		if !slices.Equal(got.tokens, want) {
			t.Errorf("seq %d: batched %v, alone %v", i, got.tokens, want)
		}
		if got.finish != api.FinishLength || got.usage.CompletionTokens != s.MaxTokens || got.usage.PromptTokens != len(s.Prompt) {
			t.Errorf("seq %d: finish %q usage %+v", i, got.finish, got.usage)
		}
	}
	// The figures are published once a loop turn, after the step that
	// delivered the last sequence's final chunk: wait for that turn.
	st := r.b.Stats()
	for deadline := time.Now().Add(5 * time.Second); (st.Running != 0 || st.KVReserved != 0) && time.Now().Before(deadline); st = r.b.Stats() {
		time.Sleep(time.Millisecond)
	}
	if st.Running != 0 || st.KVReserved != 0 {
		t.Errorf("after all finished: %+v", st)
	}
	if r.sim.Stats().MaxBatch > 4 {
		t.Errorf("batch limit 4 exceeded: %d", r.sim.Stats().MaxBatch)
	}
}

func TestStopConditions(t *testing.T) {
	r := newRig(t, nil, nil)
	ref := alone(t, prompt(1, 8), 6)
	tests := []struct {
		name   string
		seq    *batcher.Sequence
		want   []int32
		finish api.FinishReason
	}{
		{"max tokens", &batcher.Sequence{Prompt: prompt(1, 8), MaxTokens: 4}, ref[:4], api.FinishLength},
		{"stop token", &batcher.Sequence{Prompt: prompt(1, 8), MaxTokens: 6, StopTokens: []int32{ref[2]}}, ref[:2], api.FinishStop},
		{"stop string", &batcher.Sequence{Prompt: prompt(1, 8), MaxTokens: 6, Text: &stopAfter{n: 2}}, ref[:2], api.FinishStop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.submit(t, tt.seq)
			got := collect(tt.seq)
			if got.err != nil || !slices.Equal(got.tokens, tt.want) || got.finish != tt.finish {
				t.Errorf("got %v %q %v, want %v %q", got.tokens, got.finish, got.err, tt.want, tt.finish)
			}
		})
	}
}

// stopAfter is a Detokenizer that reports a stop string on its n-th token.
type stopAfter struct{ n, seen int }

func (s *stopAfter) Add(int32) (string, bool) { s.seen++; return "x", s.seen == s.n }
func (s *stopAfter) Flush() string            { return "" }

func TestEOSEndsSequence(t *testing.T) {
	r := newRig(t, []enginetest.SimOption{enginetest.WithEOS(7), enginetest.WithEOSProbability(0.3)}, nil)
	ended := 0
	for i := range 20 {
		s := &batcher.Sequence{Prompt: prompt(i, 6), MaxTokens: 50}
		r.submit(t, s)
		got := collect(s)
		if got.err != nil {
			t.Fatal(got.err)
		}
		// The EOS token ends the stream without being emitted.
		if slices.Contains(got.tokens, 7) {
			t.Errorf("EOS emitted: %v", got.tokens)
		}
		if got.finish == api.FinishStop {
			ended++
			if got.usage.CompletionTokens != len(got.tokens)+1 {
				t.Errorf("usage counts %d tokens, %d emitted plus EOS", got.usage.CompletionTokens, len(got.tokens))
			}
		}
	}
	if ended == 0 {
		t.Error("no sequence ended on EOS")
	}
}

func TestCancelFreesKVWithinAStep(t *testing.T) {
	r := newRig(t, []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)}, nil)
	s := &batcher.Sequence{Prompt: prompt(3, 10), MaxTokens: 100000, IgnoreEOS: true}
	r.submit(t, s)
	if _, err := s.Recv(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Cancel(context.Canceled)
	got := collect(s)
	if !errors.Is(got.err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", got.err)
	}
	// The stream ends when the batcher freed the sequence.
	if open := r.sim.Stats().OpenSequences; open != 0 {
		t.Errorf("%d sequences still open in the engine", open)
	}
}

func TestPreemptionRecomputes(t *testing.T) {
	r := newRig(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0)},
		[]scheduler.Option{scheduler.WithPreemption(true)}, batcher.WithMaxBatch(1))
	bg := &batcher.Sequence{Prompt: prompt(4, 8), MaxTokens: 40, IgnoreEOS: true, Tier: api.Background}
	r.submit(t, bg)
	if _, err := bg.Recv(context.Background()); err != nil { // background is running
		t.Fatal(err)
	}
	crit := &batcher.Sequence{Prompt: prompt(5, 8), MaxTokens: 5, IgnoreEOS: true, Tier: api.Critical}
	r.submit(t, crit)
	c := collect(crit)
	if c.err != nil || !slices.Equal(c.tokens, alone(t, crit.Prompt, 5)) {
		t.Fatalf("critical: %v %v", c.tokens, c.err)
	}
	rest := collect(bg)
	if rest.err != nil {
		t.Fatal(rest.err)
	}
	want := alone(t, bg.Prompt, 40)
	if got := append([]int32{want[0]}, rest.tokens...); !slices.Equal(got, want) {
		t.Errorf("preempted stream: got %v, want %v", got, want)
	}
	if rest.usage.Preemptions != 1 {
		t.Errorf("preemptions %d, want 1", rest.usage.Preemptions)
	}
}

// flaky fails chosen steps with ErrWorkerLost, like a crashed worker.
type flaky struct {
	engine.Model
	steps  atomic.Int64
	failAt map[int64]bool
}

func (f *flaky) Step(ctx context.Context, in []engine.StepInput) ([]engine.StepOutput, error) {
	if f.failAt[f.steps.Add(1)] {
		return nil, fmt.Errorf("worker 0 exited: %w", engine.ErrWorkerLost)
	}
	return f.Model.Step(ctx, in)
}

func TestLostWorkerIsRecovered(t *testing.T) {
	sim, m := simModel(t)
	// Lost on the first step, before any token: retried from the prompt,
	// same tokens as an undisturbed run.
	f := &flaky{Model: m, failAt: map[int64]bool{1: true, 2: true}}
	r := newRigModel(t, sim, f, nil)
	s := &batcher.Sequence{Prompt: prompt(6, 8), MaxTokens: 10, IgnoreEOS: true}
	r.submit(t, s)
	got := collect(s)
	if got.err != nil {
		t.Fatal(got.err)
	}
	if want := alone(t, s.Prompt, 10); !slices.Equal(got.tokens, want) {
		t.Errorf("after two retries: %v, want %v", got.tokens, want)
	}
	if got.usage.Preemptions != 2 {
		t.Errorf("preemptions %d, want 2", got.usage.Preemptions)
	}

	// Lost after tokens reached the caller: resumed from prompt + the
	// delivered tokens, the stream the same as an undisturbed one.
	late := &flaky{Model: m, failAt: map[int64]bool{3: true, 7: true}}
	var seen []batcher.ResumeStats
	r1 := newRigModel(t, sim, late, nil, batcher.WithResumeObserver(func(rs batcher.ResumeStats) { seen = append(seen, rs) }))
	s1 := &batcher.Sequence{Prompt: prompt(6, 8), MaxTokens: 10, IgnoreEOS: true}
	r1.submit(t, s1)
	got = collect(s1)
	if got.err != nil || !slices.Equal(got.tokens, alone(t, s1.Prompt, 10)) {
		t.Errorf("lost after 2 and again after more tokens: %v %v, want the undisturbed tokens", got.err, got.tokens)
	}
	if got.usage == nil || got.usage.Resumes != 2 || got.usage.ResumeGap <= 0 {
		t.Errorf("usage %+v, want 2 resumes and their gap", got.usage)
	}
	// Steps 1 and 2 deliver two tokens, 3 fails; 4 (the recompute), 5
	// and 6 deliver three more, 7 fails.
	if len(seen) != 2 || seen[0].Cause != batcher.ResumeWorkerLost || seen[0].Delivered != 2 || seen[1].Delivered != 5 ||
		seen[0].Gap+seen[1].Gap != got.usage.ResumeGap {
		t.Errorf("observed resumes %+v, want two after 2 and 5 tokens adding up to the usage's gap", seen)
	}
	if st := r1.b.Stats(); st.Resumed != 2 {
		t.Errorf("resumed %d times, want 2", st.Resumed)
	}

	// Seeded and penalised sampling resume exactly on a model that
	// reports engine.Info.Resumes: the stream is the undisturbed one.
	seededParams := engine.SamplingParams{Temperature: 0.8, Seed: 7, HasSeed: true, PresencePenalty: 1, FrequencyPenalty: 0.5}
	undisturbed := newRigModel(t, sim, m, nil)
	us := &batcher.Sequence{Prompt: prompt(6, 8), MaxTokens: 10, IgnoreEOS: true, Params: seededParams}
	undisturbed.submit(t, us)
	want := collect(us)
	seeded := &flaky{Model: m, failAt: map[int64]bool{3: true, 6: true}}
	rs := newRigModel(t, sim, seeded, nil)
	ss := &batcher.Sequence{Prompt: prompt(6, 8), MaxTokens: 10, IgnoreEOS: true, Params: seededParams}
	rs.submit(t, ss)
	got = collect(ss)
	if want.err != nil || got.err != nil || !slices.Equal(got.tokens, want.tokens) {
		t.Errorf("seeded and penalised, lost twice: %v %v, want the undisturbed %v %v", got.err, got.tokens, want.err, want.tokens)
	}

	// On a model that does not report it they cannot: the stream says it
	// was cut.
	plain, err := enginetest.NewSim(enginetest.WithoutResume())
	if err != nil {
		t.Fatal(err)
	}
	pm, err := plain.Load(context.Background(), engine.ModelSpec{ID: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	rp := newRigModel(t, plain, &flaky{Model: pm, failAt: map[int64]bool{3: true}}, nil)
	sp := &batcher.Sequence{Prompt: prompt(6, 8), MaxTokens: 10, IgnoreEOS: true,
		Params: engine.SamplingParams{Temperature: 0.8, Seed: 7, HasSeed: true}}
	rp.submit(t, sp)
	got = collect(sp)
	var ie *retry.InterruptedError
	if !errors.As(got.err, &ie) || ie.Delivered != 2 || len(got.tokens) != 2 || retry.Retryable(got.err) || !errors.Is(got.err, engine.ErrWorkerLost) {
		t.Errorf("seeded, lost after 2 tokens on a model that does not resume: %v (%d tokens), want an InterruptedError after 2", got.err, len(got.tokens))
	}

	// The attempts bound the failures between two tokens: lost four
	// times, with a token after each resume, under a policy of two
	// attempts, the stream still completes.
	often := &flaky{Model: m, failAt: map[int64]bool{3: true, 5: true, 7: true, 9: true}}
	ro := newRigModel(t, sim, often, nil, batcher.WithRecoveries(1))
	so := &batcher.Sequence{Prompt: prompt(6, 8), MaxTokens: 10, IgnoreEOS: true}
	ro.submit(t, so)
	if got := collect(so); got.err != nil || !slices.Equal(got.tokens, alone(t, so.Prompt, 10)) || got.usage.Resumes != 4 {
		t.Errorf("lost four times with progress between: %v %v, want the undisturbed tokens after 4 resumes", got.err, got.tokens)
	}

	// Past the policy's attempts the stream fails, saying so.
	always := &flaky{Model: m, failAt: map[int64]bool{}}
	for i := int64(1); i < 100; i++ {
		always.failAt[i] = true
	}
	r2 := newRigModel(t, sim, always, nil, batcher.WithRecoveries(1))
	s2 := &batcher.Sequence{Prompt: prompt(7, 8), MaxTokens: 10}
	r2.submit(t, s2)
	var ex *retry.ExhaustedError
	if got := collect(s2); !errors.As(got.err, &ex) || ex.Attempts != 2 || !errors.Is(got.err, engine.ErrWorkerLost) {
		t.Errorf("always lost: %v, want an ExhaustedError after 2 attempts", got.err)
	}
}

// TestRetryWaitsAndCloseFailsWaiting: a retry waits the policy's backoff;
// closing the batcher meanwhile fails the waiting sequence.
func TestRetryWaitsAndCloseFailsWaiting(t *testing.T) {
	sim, m := simModel(t)
	slow := retry.MustPolicy(retry.WithBackoff(time.Hour, time.Hour, 1), retry.WithJitter(0))
	r := newRigModel(t, sim, &flaky{Model: m, failAt: map[int64]bool{1: true}}, nil, batcher.WithRetryPolicy(slow))
	s := &batcher.Sequence{Prompt: prompt(8, 8), MaxTokens: 4}
	r.submit(t, s)
	time.Sleep(50 * time.Millisecond)
	select {
	case <-s.Done():
		t.Fatal("the sequence ended instead of waiting for its retry")
	default:
	}
	r.b.Close()
	if got := collect(s); !errors.Is(got.err, batcher.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", got.err)
	}
}

func TestAdaptiveBatchSizing(t *testing.T) {
	// Each token in a step costs 1 ms: a 10 ms target allows about 10.
	r := newRig(t, []enginetest.SimOption{enginetest.WithStepTime(0, time.Millisecond), enginetest.WithMaxBatch(64)}, nil,
		batcher.WithTargetStepLatency(10*time.Millisecond, 2))
	var seqs []*batcher.Sequence
	for i := range 40 {
		s := &batcher.Sequence{Prompt: prompt(i, 2), MaxTokens: 60, IgnoreEOS: true}
		r.submit(t, s)
		seqs = append(seqs, s)
	}
	var wg sync.WaitGroup
	for _, s := range seqs {
		wg.Add(1)
		go func() { defer wg.Done(); collect(s) }()
	}
	wg.Wait()
	// A loaded machine only lengthens steps, which lowers the limit, so
	// only the upper bound is tight: without adaptation the limit would
	// stay at 40 running sequences.
	if l := r.b.Stats().Limit; l < 2 || l > 16 {
		t.Errorf("adaptive limit settled at %d, want near 10 (at least the minimum, 2)", l)
	}
}

func TestShutdownFinishesQueuedWork(t *testing.T) {
	r := newRig(t, nil, nil, batcher.WithMaxBatch(2))
	var seqs []*batcher.Sequence
	for i := range 6 {
		s := &batcher.Sequence{Prompt: prompt(i, 4), MaxTokens: 5, IgnoreEOS: true}
		r.submit(t, s)
		seqs = append(seqs, s)
	}
	if err := r.b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		if got := collect(s); got.err != nil || len(got.tokens) != 5 {
			t.Errorf("seq %d: %d tokens, %v", i, len(got.tokens), got.err)
		}
	}
}

func TestCloseFailsRunning(t *testing.T) {
	r := newRig(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0)}, nil)
	s := &batcher.Sequence{Prompt: prompt(1, 4), MaxTokens: 100000, IgnoreEOS: true}
	r.submit(t, s)
	if _, err := s.Recv(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.b.Close()
	if got := collect(s); !errors.Is(got.err, batcher.ErrClosed) {
		t.Errorf("want ErrClosed, got %v", got.err)
	}
	if open := r.sim.Stats().OpenSequences; open != 0 {
		t.Errorf("%d sequences left open", open)
	}
}

func TestOptionsValidated(t *testing.T) {
	sim, _ := enginetest.NewSim(enginetest.WithMaxBatch(8))
	defer sim.Close()
	m, _ := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
	q, _ := scheduler.New[*batcher.Sequence]()
	defer q.Close()
	for _, o := range []batcher.Option{
		batcher.WithTokenBudget(0), batcher.WithTokenBudget(4), batcher.WithMaxBatch(-1),
		batcher.WithTargetStepLatency(time.Millisecond, 0), batcher.WithTargetStepLatency(time.Millisecond, 9),
		batcher.WithRecoveries(-1), batcher.WithLogger(nil), batcher.WithRetryPolicy(nil),
	} {
		if b, err := batcher.New(m, q, o); err == nil {
			b.Close()
			t.Errorf("option accepted")
		}
	}
}

// TestCheckOptions: CheckOptions refuses what New would refuse for any
// model, and leaves what depends on the model to New.
func TestCheckOptions(t *testing.T) {
	for _, tc := range []struct {
		opts []batcher.Option
		ok   bool
	}{
		{[]batcher.Option{batcher.WithTokenBudget(0)}, false},
		{[]batcher.Option{batcher.WithMaxBatch(4), batcher.WithTargetStepLatency(time.Millisecond, 8)}, false},
		{[]batcher.Option{batcher.WithTargetStepLatency(time.Millisecond, 8)}, true},    // the model's limit decides
		{[]batcher.Option{batcher.WithMaxBatch(64), batcher.WithTokenBudget(16)}, true}, // a model of 16 or fewer runs it
	} {
		if err := batcher.CheckOptions(tc.opts...); (err == nil) != tc.ok {
			t.Errorf("%d options: CheckOptions = %v, want ok %v", len(tc.opts), err, tc.ok)
		}
	}
}

// stepTokensModel reports a preferred step size, as the torch engine does
// on CUDA.
type stepTokensModel struct {
	engine.Model
	n int
}

func (m stepTokensModel) Info() engine.Info {
	i := m.Model.Info()
	i.StepTokens = m.n
	return i
}

// TestEngineStepTokens: the engine's StepTokens is the token budget unless
// the caller sets one.
func TestEngineStepTokens(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []batcher.Option
		want int
	}{
		{"engine's", nil, 100},
		{"caller's", []batcher.Option{batcher.WithTokenBudget(80)}, 80},
	} {
		t.Run(c.name, func(t *testing.T) {
			sim, m := simModel(t)
			var mu sync.Mutex
			most := 0
			observe := batcher.WithStepObserver(func(s batcher.StepStats) {
				mu.Lock()
				most = max(most, s.PrefillTokens)
				mu.Unlock()
			})
			r := newRigModel(t, sim, stepTokensModel{m, 100}, nil, append(c.opts, observe)...)
			s := &batcher.Sequence{Prompt: prompt(1, 250), MaxTokens: 2, IgnoreEOS: true}
			r.submit(t, s)
			if got := collect(s); got.err != nil {
				t.Fatal(got.err)
			}
			mu.Lock()
			defer mu.Unlock()
			if most != c.want {
				t.Errorf("largest prompt chunk %d tokens, want the budget %d", most, c.want)
			}
		})
	}
}

// spanModel records when each of its steps was called and returned.
type spanModel struct {
	engine.Model
	mu    sync.Mutex
	spans [][2]time.Time
}

func (m *spanModel) Step(ctx context.Context, in []engine.StepInput) ([]engine.StepOutput, error) {
	start := time.Now()
	out, err := m.Model.Step(ctx, in)
	m.mu.Lock()
	m.spans = append(m.spans, [2]time.Time{start, time.Now()})
	m.mu.Unlock()
	return out, err
}

// TestStepBetween: StepStats.Between is the batcher's time from one
// step's return to the next step's call — positive between the steps of
// a busy run, never more than the gap the engine saw, and zero for the
// first step after the batcher waited for work (not the wait itself).
func TestStepBetween(t *testing.T) {
	sim, m := simModel(t)
	var mu sync.Mutex
	var between []time.Duration
	observe := batcher.WithStepObserver(func(s batcher.StepStats) {
		mu.Lock()
		between = append(between, s.Between)
		mu.Unlock()
	})
	spans := &spanModel{Model: m}
	r := newRigModel(t, sim, spans, nil, observe)
	observed := func() int { // once every step the engine ran was observed
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			mu.Lock()
			spans.mu.Lock()
			n, ran := len(between), len(spans.spans)
			spans.mu.Unlock()
			mu.Unlock()
			if n == ran {
				return n
			}
		}
		t.Fatal("steps not observed")
		return 0
	}
	firsts := map[int]bool{0: true}
	for run := range 2 {
		if run > 0 {
			firsts[observed()] = true
			time.Sleep(50 * time.Millisecond) // the batcher waits for work
		}
		s := &batcher.Sequence{Prompt: prompt(1, 8), MaxTokens: 6, IgnoreEOS: true}
		r.submit(t, s)
		if got := collect(s); got.err != nil {
			t.Fatal(got.err)
		}
	}
	observed()
	mu.Lock()
	defer mu.Unlock()
	spans.mu.Lock()
	defer spans.mu.Unlock()
	if len(between) < 4 {
		t.Fatalf("%d steps, want several a run", len(between))
	}
	for i, b := range between {
		first := firsts[i] // the first step of each run
		switch {
		case first && b != 0:
			t.Errorf("step %d, the first after a wait for work: Between %v, want 0", i, b)
		case !first && b <= 0:
			t.Errorf("step %d: Between %v, want the batcher's time since step %d", i, b, i-1)
		case !first && b > spans.spans[i][0].Sub(spans.spans[i-1][1]):
			t.Errorf("step %d: Between %v, more than the %v between the engine's steps", i, b, spans.spans[i][0].Sub(spans.spans[i-1][1]))
		}
	}
}

// steppingModel reports whether one of its steps is running. It keeps
// the simulated model's block pool, so the batcher pages.
type steppingModel struct {
	pagedModel
	in atomic.Bool
}

type pagedModel interface {
	engine.Model
	engine.BlockPool
}

func (m *steppingModel) Step(ctx context.Context, in []engine.StepInput) ([]engine.StepOutput, error) {
	m.in.Store(true)
	defer m.in.Store(false)
	time.Sleep(2 * time.Millisecond) // room for the text work behind it
	return m.pagedModel.Step(ctx, in)
}

// wordsOf is a Detokenizer without stop strings: each token's text is
// "t<id> ", and it records how many of its Adds ran while the engine
// stepped. The chunks' text must still follow the tokens in order.
type wordsOf struct {
	m           *steppingModel
	duringSteps *atomic.Int64
}

func (w wordsOf) Add(id int32) (string, bool) {
	if w.m != nil && w.m.in.Load() {
		w.duringSteps.Add(1)
	}
	return fmt.Sprintf("t%d ", id), false
}
func (w wordsOf) Flush() string    { return "" }
func (w wordsOf) NeverStops() bool { return true }

// TestTextBehindStep: with WithTextBehindStep (the default) the text work
// of a step's tokens runs while the engine runs the next step, and every
// stream still gets each token's chunk, with its text, in order, and its
// last one before the finish; turned off, none runs during a step. A
// stream cancelled and streams preempted (a pool too small for all) with
// a chunk pending lose none.
func TestTextBehindStep(t *testing.T) {
	for _, behind := range []bool{true, false} {
		t.Run(fmt.Sprint("behind=", behind), func(t *testing.T) {
			// Six sequences growing to 5 blocks each in a pool of 8, as
			// TestPagedPoolRunsOut: some are preempted.
			sim, m := simModel(t, enginetest.WithBlockSize(16), enginetest.WithKVCapacity(8*16), enginetest.WithContextLength(128))
			sm := &steppingModel{pagedModel: m.(pagedModel)}
			r := newRigModel(t, sim, sm, []scheduler.Option{scheduler.WithPreemption(true)}, batcher.WithTextBehindStep(behind))
			var during atomic.Int64
			var seqs []*batcher.Sequence
			for i := range 6 {
				s := &batcher.Sequence{Prompt: prompt(i, 20), MaxTokens: 50 + i, IgnoreEOS: true,
					Text: wordsOf{sm, &during}}
				r.submit(t, s)
				seqs = append(seqs, s)
			}
			for i, s := range seqs {
				toks, texts, _, finish := textStream(t, fmt.Sprint("seq ", i), s)
				for j, tok := range toks {
					if want := fmt.Sprintf("t%d ", tok); texts[j] != want {
						t.Fatalf("seq %d: token %d's chunk has text %q, want %q", i, tok, texts[j], want)
					}
				}
				if len(toks) != s.MaxTokens || finish != api.FinishLength {
					t.Errorf("seq %d: %d tokens, finish %q; want %d, length", i, len(toks), finish, s.MaxTokens)
				}
				if want := alone(t, s.Prompt, s.MaxTokens); !slices.Equal(toks, want) {
					t.Errorf("seq %d: %v, alone %v", i, toks, want)
				}
			}
			if st := r.b.Stats(); st.BlockPreemptions == 0 {
				t.Error("no stream was preempted: the pool is sized to make some wait")
			}
			if n := during.Load(); behind != (n > 0) {
				t.Errorf("text behind the step %v: %d of the detokenizer's calls ran during a step", behind, n)
			}
			// A cancelled stream with a chunk pending ends with the
			// cancellation, its chunks before it.
			ctx, cancel := context.WithCancel(context.Background())
			s := &batcher.Sequence{Prompt: prompt(9, 6), MaxTokens: 100, IgnoreEOS: true, Text: wordsOf{sm, &during}}
			r.submit(t, s)
			got := 0
			for {
				c, err := s.Recv(ctx)
				if err != nil {
					if got < 3 || errors.Is(err, batcher.ErrStreamDone) {
						t.Fatalf("cancelled stream after %d tokens: %v", got, err)
					}
					break
				}
				if c.HasToken {
					got++
					if got == 3 {
						cancel()
					}
				}
			}
			cancel()
		})
	}
}

// TestTextBehindStepForced: a resumed sequence's forced tokens, emitted
// together at admission, reach the reader in order with their text and
// before the finish, the last of them finishing the sequence.
func TestTextBehindStepForced(t *testing.T) {
	r := newRig(t, nil, nil)
	var during atomic.Int64
	s := &batcher.Sequence{Prompt: prompt(1, 8), MaxTokens: 3, IgnoreEOS: true, Forced: []int32{7, 8, 9}, Text: wordsOf{nil, &during}}
	r.submit(t, s)
	toks, _, text, finish := textStream(t, "forced", s)
	if !slices.Equal(toks, []int32{7, 8, 9}) || text != "t7 t8 t9 " || finish != api.FinishLength {
		t.Errorf("tokens %v, text %q, finish %q; want [7 8 9], \"t7 t8 t9 \", length", toks, text, finish)
	}
}

// textStream reads s to its end: its tokens, each token's chunk text, the
// stream's whole text and its finish. A chunk after the finish, or an
// error, fails t (name says which stream).
func textStream(t *testing.T, name string, s *batcher.Sequence) (toks []int32, texts []string, text string, finish api.FinishReason) {
	t.Helper()
	var all strings.Builder
	for {
		c, err := s.Recv(context.Background())
		if errors.Is(err, batcher.ErrStreamDone) {
			return toks, texts, all.String(), finish
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if finish != "" {
			t.Fatalf("%s: a chunk after the finish", name)
		}
		if c.HasToken {
			toks = append(toks, c.Token)
			texts = append(texts, c.Text)
		}
		all.WriteString(c.Text)
		finish = c.Finish
	}
}
