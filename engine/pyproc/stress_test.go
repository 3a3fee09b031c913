package pyproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/batcher/batchertest"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestPipelineStressRealWorker runs random workloads through the
// continuous batcher, pipelined (steps sent ahead with Prev rows, opens
// sent ahead with Opening rows, frees while steps are out), over the tiny
// checkpoint on real workers, one and two: requests arriving in bursts
// with prompts prefilled in chunks, half going on from an earlier
// request's prompt under its saved key or from the prefix cache, every
// tier, greedy and seeded sampling with log-probabilities and penalties,
// pools of one or two contexts a worker so that sequences preempt each
// other for blocks (and, on two workers, one worker refuses steps the
// pools' sum has room for), a few requests whose open or steps must wait
// for the pending step (a LoRA adapter, one the model does not serve, a
// constraint), and cancellations at every point of a request's life —
// before it is queued, while queued, after a random delay, when the step
// carrying its last prompt chunk is sent or waited for, when the engine
// is asked to open it, and from its reader after some tokens. Every
// stream must end; one not cancelled gets the tokens (and
// log-probabilities) its request gets alone on the same model, a
// cancelled one a prefix of them; nothing is logged at warning level;
// and once all have ended the workers hold no sequence and every block
// is free. The package's TestMain checks that no goroutine outlives the
// tests. MLXSERVING_STRESS_SEEDS=N runs N seeds a worker count instead of
// 3 (each seed's subtest runs alone with -run, e.g.
// 'TestPipelineStressRealWorker/workers=2/seed=14$').
func TestPipelineStressRealWorker(t *testing.T) {
	lora := filepath.Join(t.TempDir(), "lora")
	if err := testmodel.WriteAdapter(lora, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 81}); err != nil {
		t.Fatal(err)
	}
	seeds := uint64(3)
	if n, err := strconv.ParseUint(os.Getenv("MLXSERVING_STRESS_SEEDS"), 10, 64); err == nil { // more, to hunt
		seeds = n
	}
	// One worker, and two: each runs its part of a step, behind its own
	// part of the step before, from its own pool.
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			logs := &stressLog{}
			e := newEngine(t, WithWorkers(workers), WithTuning(Tuning{BlockSize: 8}), WithLogger(slog.New(logs)))
			for seed := range seeds {
				t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
					logs.reset()
					runStress(t, e, lora, logs, seed)
				})
			}
		})
	}
}

// errStressCancelled is what the stress test cancels streams with: a
// cancelled stream that ends with another error did not end by its
// cancellation.
var errStressCancelled = errors.New("cancelled by the stress test")

// unknownAdapter is the adapter of requests that fail at their open.
const unknownAdapter = "none"

// stressWorkload is seed's random mix: 30 to 60 requests arriving in
// bursts, a context of 128 to 256 tokens and a pool (a worker's) of one
// context (much preemption for blocks, saved prefixes soon evicted; two
// seeds in three) or two (fewer preemptions, more prefixes reused),
// prompts of up to half the context prefilled in chunks of a 16- to
// 47-token budget, up to 64 tokens each.
// Half go on from an earlier prompt, whole or in part: most under the key
// of an earlier request that saves its KV when it finishes, the others
// from the prefix cache.
func stressWorkload(seed uint64) (cases []*batchertest.Case, ctxLen, pool int, opts []batcher.Option) {
	rng := rand.New(rand.NewPCG(seed, 91))
	tiers := []api.Tier{api.Critical, api.Normal, api.Background}
	ctxLen = (8 + rng.IntN(9)) * 16
	pool = ctxLen * (1 + rng.IntN(3)/2)
	cases = make([]*batchertest.Case, 30+rng.IntN(31))
	for i := range cases {
		c := &batchertest.Case{}
		switch k := rng.IntN(15); {
		case k < 5:
			c.Mode = batchertest.Kept
		case k == 5:
			c.Mode = batchertest.BeforeQueue
		case k == 6:
			c.Mode = batchertest.Queued
		case k < 9:
			c.Mode = batchertest.AfterDelay
			c.Delay = time.Duration(rng.IntN(30000)) * time.Microsecond
		case k < 11:
			c.Mode = batchertest.AfterTokens
		case k < 14:
			c.Mode = batchertest.AtLastChunk
			c.AtSend = rng.IntN(3) == 0
		default:
			c.Mode = batchertest.AtOpen
		}
		p := prompt(int(seed)*1000+i, 1+rng.IntN(ctxLen/2))
		s := &batcher.Sequence{IgnoreEOS: true, Tier: tiers[rng.IntN(3)]}
		if rng.IntN(3) != 0 {
			s.SaveKey = fmt.Sprint("k", i)
		}
		if i > 0 && rng.IntN(2) == 0 {
			// It goes on from an earlier prompt, whole or in part: under
			// the key of a request that saves its KV when it finishes, or
			// from the prefix cache.
			var saving []int
			for j, e := range cases[:i] {
				if e.Mode == batchertest.Kept && e.Seq.SaveKey != "" && e.Seq.Adapter == "" {
					saving = append(saving, j)
				}
			}
			j := rng.IntN(i)
			keyed := len(saving) > 0 && rng.IntN(4) != 0
			if keyed {
				j = saving[rng.IntN(len(saving))]
				s.PrefixKey = cases[j].Seq.SaveKey
			}
			prev := cases[j].Seq.Prompt
			cut := len(prev)
			if rng.IntN(3) == 0 {
				cut = rng.IntN(len(prev) + 1)
			}
			p = append(slices.Clone(prev[:cut]), p[:1+rng.IntN(len(p))/2]...)
			p = p[:min(len(p), ctxLen*3/4)]
		}
		s.Prompt, s.MaxTokens = p, 1+rng.IntN(min(ctxLen-len(p), 64))
		s.Params = stressParams(rng, seed*1000+uint64(i))
		c.Seq = s
		if c.Mode == batchertest.AfterTokens {
			c.Tokens = 1 + rng.IntN(s.MaxTokens)
		}
		switch k := rng.IntN(20); {
		case k < 2 && s.PrefixKey == "":
			s.Adapter = "lora"
			c.BehindStep = rng.IntN(2) == 0
		case k == 2:
			s.Adapter = unknownAdapter // fails after the admission waited for the pending step
			c.BehindStep = rng.IntN(2) == 0
		case k == 3:
			s.Constraint = batchertest.AllowAll{}
			c.BehindStep = rng.IntN(2) == 0
		}
		if rng.IntN(4) == 0 { // they arrive in bursts
			c.Gap = time.Duration(5+rng.IntN(40)) * time.Millisecond
		} else {
			c.Gap = time.Duration(rng.IntN(1000)) * time.Microsecond
		}
		cases[i] = c
	}
	maxBatch := 3 + rng.IntN(12)
	opts = []batcher.Option{batcher.WithMaxBatch(maxBatch), batcher.WithTokenBudget(max(maxBatch, 16+rng.IntN(32)))}
	return cases, ctxLen, pool, opts
}

// stressParams picks sampling parameters: greedy, with log-probabilities,
// seeded temperature with top log-probabilities, a repetition penalty,
// seeded penalised draws. Each is reproducible, also across a preemption
// (a seeded or penalised sequence resumes with Generated counting its
// tokens), up to the last bits of the probabilities, which differ from
// one batch shape to another: a draw within them of the boundary between
// two tokens may take either (seed 124 on two workers drew token 54 alone,
// 2e-9 of the total above token 53's end, and 53 batched). Without top-k,
// top-p or min-p that token is the next or the one before (sameAs allows
// it); their cutoffs would drop or keep a token that close to them, and
// move the draw anywhere (seed 243 drew so with top-p 0.9 and min-p
// 0.05); TestPipelineSameTokens checks them at equal batch shapes.
func stressParams(rng *rand.Rand, seed uint64) engine.SamplingParams {
	switch rng.IntN(6) {
	case 0:
		return engine.SamplingParams{}
	case 1:
		return engine.SamplingParams{Logprobs: true}
	case 2:
		return engine.SamplingParams{Temperature: 0.9, Seed: seed, HasSeed: true, Logprobs: true}
	case 3:
		return engine.SamplingParams{Temperature: 0.7, Seed: seed, HasSeed: true, Logprobs: true, TopLogprobs: 3}
	case 4:
		return engine.SamplingParams{RepetitionPenalty: 1.3, Logprobs: true}
	default:
		return engine.SamplingParams{PresencePenalty: 0.6, FrequencyPenalty: 0.4, Temperature: 0.8, Seed: seed, HasSeed: true, Logprobs: true}
	}
}

// stressResult is what a stream delivered, or what a request gets alone.
type stressResult struct {
	tokens []int32
	lps    []float32
	top    [][]api.TopLogprob
	finish api.FinishReason
	usage  *api.Usage
	err    error
}

// runStress runs seed's workload (stressWorkload) through a batcher over
// a model of its own on e, checks every stream against its request run
// alone and the model left idle, and logs what the run exercised.
func runStress(t *testing.T, e *Engine, lora string, logs *stressLog, seed uint64) {
	cases, ctxLen, pool, opts := stressWorkload(seed)
	workers := len(e.slots)
	m := loadSpec(t, e, engine.ModelSpec{ID: fmt.Sprint("stress", seed), Path: tiny(t), ContextLength: ctxLen, KVCapacity: workers * pool, AdapterSlots: 1})
	addAdapter(t, m, "lora", lora)
	info := m.Info()
	if !info.Paged() || info.KVBlocks != workers*pool/8 || !m.pipelines {
		t.Fatalf("Info %+v, pipelines %v: want %d blocks of 8 on each of %d workers, pipelined", info, m.pipelines, pool/8, workers)
	}
	w := &stressModel{Model: m, Canceller: batchertest.NewCanceller(cases, errStressCancelled)}
	q, err := scheduler.New[*batcher.Sequence](scheduler.WithPreemption(true))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	b, err := batcher.New(w, q, append(opts, batcher.WithLogger(slog.New(logs)))...)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			b.Close()
		}
	}()

	start := time.Now()
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second) // a stream still open then hangs
	defer stop()
	results := make([]stressResult, len(cases))
	push := func(s *batcher.Sequence) error {
		return q.Push(&batcher.Entry{Value: s, Tier: s.Tier, Cost: len(s.Prompt) + s.MaxTokens})
	}
	w.Drive(ctx, cases, push, func(i int, c *batchertest.Case) { results[i] = readStress(ctx, c) },
		func(err error) { t.Errorf("queueing: %v", err) })
	ran := time.Since(start)
	for i, c := range cases {
		if errors.Is(results[i].err, context.DeadlineExceeded) {
			t.Fatalf("request %d (%s): the stream did not end (%d tokens)", i, c.Mode, len(results[i].tokens))
		}
	}
	stressIdle(t, e, w, b)
	st := b.Stats()
	w.call.Lock()
	evicted := len(m.EvictedSaved())
	w.call.Unlock()
	b.Close()
	closed = true

	// Each request alone on the same model: as many tokens as its stream
	// got (all it asks for when it was not cancelled).
	var cancelledBy, finishedAnyway [batchertest.Modes]int
	preempted, ended, ties := 0, 0, 0
	for i, c := range cases {
		got, s := results[i], c.Seq
		name := fmt.Sprintf("seed %d request %d (%s, prompt %d, max %d, adapter %q, constrained %v, params %+v)",
			seed, i, c.Mode, len(s.Prompt), s.MaxTokens, s.Adapter, s.Constraint != nil, s.Params)
		cancelled := c.Mode != batchertest.Kept
		if got.usage != nil {
			preempted += got.usage.Preemptions
		}
		switch {
		case errors.Is(got.err, errStressCancelled):
			cancelledBy[c.Mode]++
		case got.err == nil:
			finishedAnyway[c.Mode]++
		}
		if s.Adapter == unknownAdapter {
			if len(got.tokens) > 0 || got.err == nil || (!cancelled && !errors.Is(got.err, engine.ErrModelNotFound)) {
				t.Errorf("%s: %d tokens, err %v; want none and an unknown adapter's error", name, len(got.tokens), got.err)
			}
			continue
		}
		n := len(got.tokens)
		if !cancelled {
			n = s.MaxTokens
		}
		if n == 0 {
			if !cancelled || (got.err != nil && !errors.Is(got.err, errStressCancelled)) {
				t.Errorf("%s: no tokens, finish %q, err %v", name, got.finish, got.err)
			}
			continue
		}
		want := stressAlone(t, m, engine.SeqID(1_000_000+i), s, n)
		ended++
		tie, err := got.sameAs(want, s.Params)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if tie >= 0 {
			ties++
			t.Logf("%s: token %d is %d, %d alone: a draw at the boundary of the two (see stressParams)", name, tie, got.tokens[tie], want.tokens[tie])
		}
		switch {
		case !cancelled && (got.err != nil || got.finish != api.FinishLength || len(got.tokens) != s.MaxTokens):
			t.Errorf("%s: %d tokens, finish %q, err %v", name, len(got.tokens), got.finish, got.err)
		case cancelled && got.err == nil && (got.finish != api.FinishLength || len(got.tokens) != s.MaxTokens):
			t.Errorf("%s: ended without error after %d of %d tokens, finish %q", name, len(got.tokens), s.MaxTokens, got.finish)
		case cancelled && got.err != nil && !errors.Is(got.err, errStressCancelled):
			t.Errorf("%s: ended with %v, not its cancellation", name, got.err)
		case c.Mode == batchertest.AfterTokens && len(got.tokens) < c.Tokens:
			t.Errorf("%s: cancelled after %d tokens, got %d", name, c.Tokens, len(got.tokens))
		}
	}
	// Those whose adapter is served run.
	eligible, fired := w.Fired(func(c *batchertest.Case) bool { return c.Seq.Adapter != unknownAdapter })
	if fired[batchertest.AtLastChunk] == 0 && eligible[batchertest.AtLastChunk] > 0 {
		t.Errorf("none of the %d requests to cancel at their last prompt chunk was", eligible[batchertest.AtLastChunk])
	}
	if bad := logs.problems(); len(bad) > 0 {
		t.Errorf("warnings or errors logged:\n%s", strings.Join(bad, "\n"))
	}
	n := w.counts()
	var modes []string
	for mode := range batchertest.Modes {
		if mode != batchertest.Kept {
			modes = append(modes, fmt.Sprintf("%s %d/%d", mode, cancelledBy[mode], cancelledBy[mode]+finishedAnyway[mode]))
		}
	}
	t.Logf("%d requests in %v (context %d, %d blocks): %d steps (%d sent ahead, %d drains, %d partial), %d block preemptions (%d steps refused for blocks, %d preemptions of streams that finished)",
		len(cases), ran.Round(time.Millisecond), ctxLen, info.KVBlocks, st.Steps, st.Pipelined, st.Drains, st.PartialSteps, st.BlockPreemptions, logs.oomSteps(), preempted)
	t.Logf("opens: %d sent ahead, %d waited; %d reused a prefix (%d tokens, %d by key); rows: %d opening, %d prev; frees: %d (%d saving, %d while a step was out); %d saved prefixes evicted",
		n.asyncOpens, n.opens, n.reusing, n.reusedTokens, n.keyed, n.openingRows, n.prevRows, n.frees, n.saves, n.freesBehind, evicted)
	t.Logf("cancelled (ended by the cancellation/cancelled): %s; at their last chunk %d of %d, at their open %d of %d; %d streams checked against their request alone (%d drew at a boundary)",
		strings.Join(modes, ", "), fired[batchertest.AtLastChunk], eligible[batchertest.AtLastChunk], fired[batchertest.AtOpen], eligible[batchertest.AtOpen], ended, ties)
}

// readStress reads c's stream to its end, cancelling the sequence once
// it received c.Tokens tokens when c says so. It gives up when ctx ends
// (the result's err is then ctx's).
func readStress(ctx context.Context, c *batchertest.Case) stressResult {
	var r stressResult
	for {
		chunk, err := c.Seq.Recv(ctx)
		if errors.Is(err, batcher.ErrStreamDone) {
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		if chunk.HasToken {
			r.tokens = append(r.tokens, chunk.Token)
			r.lps, r.top = append(r.lps, chunk.Logprob), append(r.top, chunk.Top)
			if c.Mode == batchertest.AfterTokens && len(r.tokens) == c.Tokens {
				c.Seq.Cancel(errStressCancelled)
			}
		}
		if chunk.Finish != "" {
			r.finish, r.usage = chunk.Finish, chunk.Usage
		}
	}
}

// stressAlone runs s's request alone on m as sequence id: its prompt in
// one step, then n tokens fed back one by one.
func stressAlone(t *testing.T, m *Model, id engine.SeqID, s *batcher.Sequence, n int) stressResult {
	t.Helper()
	ctx := context.Background()
	reused, err := m.OpenAdapter(ctx, id, s.Prompt, "", s.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free(id, "")
	params := s.Params
	feed := s.Prompt[reused:]
	var r stressResult
	for len(r.tokens) < n {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: feed, Sample: true, Params: &params}})
		if err != nil {
			t.Fatal(err)
		}
		top := make([]api.TopLogprob, len(o[0].Top))
		for i, x := range o[0].Top {
			top[i] = api.TopLogprob{Token: x.Token, Logprob: x.Logprob}
		}
		r.tokens, r.lps, r.top = append(r.tokens, o[0].Token), append(r.lps, o[0].Logprob), append(r.top, top)
		feed = []int32{o[0].Token}
	}
	return r
}

// sameAs reports whether r begins with want's tokens and, where p asks
// for them, log-probabilities within 1e-4 (a row in a step of another
// shape rounds its sums differently) and the same top tokens, of which
// two within 1e-4 of each other may come in either order. A seeded draw
// may take the token next to want's (see stressParams): r is then
// compared up to it, and tie is its index (else -1).
func (r stressResult) sameAs(want stressResult, p engine.SamplingParams) (tie int, err error) {
	const tol = 1e-4
	near := func(a, b float32) bool { return math.Abs(float64(a-b)) <= tol }
	n, tie := len(r.tokens), -1
	if n > len(want.tokens) {
		return tie, fmt.Errorf("%d tokens, %d alone", n, len(want.tokens))
	}
	if i := firstDiffAt(r.tokens, want.tokens[:n]); i < n {
		if d := r.tokens[i] - want.tokens[i]; p.Temperature == 0 || (d != 1 && d != -1) {
			return tie, fmt.Errorf("tokens %v, not a prefix of those it gets alone, %v", r.tokens, want.tokens)
		}
		n, tie = i, i
	}
	for i := range n {
		if p.Logprobs && !near(r.lps[i], want.lps[i]) {
			return tie, fmt.Errorf("token %d: logprob %v, alone %v", i, r.lps[i], want.lps[i])
		}
		got, alone := r.top[i], want.top[i]
		same := len(got) == len(alone)
		for j := 0; same && j < len(got); j++ {
			same = near(got[j].Logprob, alone[j].Logprob) &&
				(got[j].Token == alone[j].Token || slices.ContainsFunc(alone, func(x api.TopLogprob) bool {
					return x.Token == got[j].Token && near(x.Logprob, got[j].Logprob)
				}))
		}
		if !same {
			return tie, fmt.Errorf("token %d: top %v, alone %v", i, got, alone)
		}
	}
	return tie, nil
}

// stressIdle waits for the batcher to run nothing and the model and its
// worker to hold nothing — no sequence open, no step or open out, every
// block free — once every stream has ended, and fails t if they do not
// within a few seconds. The last pending step and the answers to opens of
// sequences freed before them are read on the loop's next turns, so it
// polls; it reads the model between the loop's calls (stressModel.call).
func stressIdle(t *testing.T, e *Engine, w *stressModel, b *batcher.ContinuousBatcher) {
	t.Helper()
	m := w.Model
	kv := m.Info().KVBlocks
	var state string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		w.call.Lock()
		running := b.Stats().Running
		free := m.FreeBlocks()
		inflight, pending, opening, seqs := m.inflight, m.pending != nil, len(m.opening), len(m.seqs)
		w.call.Unlock()
		var open, held, workerFree float64
		for i := range e.slots {
			st := workerStatsOf(t, e, m, i)
			o, _ := st["open"].(float64)
			h, _ := st["seq_blocks"].(float64)
			f, _ := st["free_blocks"].(float64)
			open, held, workerFree = open+o, held+h, workerFree+f
		}
		state = fmt.Sprintf("%d running in the batcher; model: %d of %d blocks free, %d requests out, pending step %v, %d opens out, %d sequences; workers: %d sequences holding %v blocks, %v free",
			running, free, kv, inflight, pending, opening, seqs, int(open), held, workerFree)
		if running == 0 && free == kv && inflight == 0 && !pending && opening == 0 && seqs == 0 && open == 0 && held == 0 && int(workerFree) == kv {
			return
		}
	}
	t.Errorf("after every stream ended: %s", state)
}

// stressModel wraps the model the batcher runs: it tells its Canceller
// of the opens and steps the batcher asks for (batchertest.Canceller) and
// counts them. call is held across every call into the model, so the
// test reads the model between them.
type stressModel struct {
	*Model
	*batchertest.Canceller
	call sync.Mutex

	mu sync.Mutex
	n  stressCounts
}

// stressCounts is what the batcher asked of the engine.
type stressCounts struct {
	opens, asyncOpens, reusing, reusedTokens, keyed int
	openingRows, prevRows                           int
	frees, saves, freesBehind                       int
}

func (w *stressModel) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	w.Opening(id, prompt)
	w.call.Lock()
	defer w.call.Unlock()
	n, err := w.Model.Open(ctx, id, prompt, key)
	w.opened(false, n, key)
	return n, err
}

func (w *stressModel) OpenAdapter(ctx context.Context, id engine.SeqID, prompt []int32, key, adapter string) (int, error) {
	w.Opening(id, prompt)
	w.call.Lock()
	defer w.call.Unlock()
	n, err := w.Model.OpenAdapter(ctx, id, prompt, key, adapter)
	w.opened(false, n, key)
	return n, err
}

func (w *stressModel) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	w.Opening(id, prompt)
	w.call.Lock()
	defer w.call.Unlock()
	p, ok := w.Model.OpenAsync(ctx, id, prompt, key)
	if !ok {
		return p, ok
	}
	return &stressOpen{PendingOpen: p, w: w, key: key}, true
}

func (w *stressModel) Free(id engine.SeqID, key string) {
	w.call.Lock()
	behind := w.Model.pending != nil
	w.Model.Free(id, key)
	w.call.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n.frees++
	if key != "" {
		w.n.saves++
	}
	if behind {
		w.n.freesBehind++
	}
}

func (w *stressModel) FreeBlocks() int {
	w.call.Lock()
	defer w.call.Unlock()
	return w.Model.FreeBlocks()
}

func (w *stressModel) Step(ctx context.Context, in []engine.StepInput) ([]engine.StepOutput, error) {
	w.Sent(in, false)
	w.call.Lock()
	defer w.call.Unlock()
	return w.Model.Step(ctx, in)
}

func (w *stressModel) StepAsync(ctx context.Context, in []engine.StepInput) (engine.PendingStep, bool, error) {
	w.call.Lock()
	p, ok, err := w.Model.StepAsync(ctx, in)
	w.call.Unlock()
	if err != nil || !ok {
		return p, ok, err
	}
	w.mu.Lock()
	for i := range in {
		if in[i].Opening {
			w.n.openingRows++
		}
		if in[i].Prev {
			w.n.prevRows++
		}
	}
	w.mu.Unlock()
	return &stressStep{PendingStep: p, w: w, cancel: w.Sent(in, true)}, true, nil
}

// stressStep is a pending step that cancels its cases when waited for,
// before it is.
type stressStep struct {
	engine.PendingStep
	w      *stressModel
	cancel []*batchertest.Case
}

func (s *stressStep) Wait(ctx context.Context) ([]engine.StepOutput, error) {
	s.w.Cancel(s.cancel)
	s.w.call.Lock()
	defer s.w.call.Unlock()
	return s.PendingStep.Wait(ctx)
}

// stressOpen is a pending open that counts what it reused.
type stressOpen struct {
	engine.PendingOpen
	w   *stressModel
	key string
}

func (o *stressOpen) Wait(ctx context.Context) (int, error) {
	o.w.call.Lock()
	n, err := o.PendingOpen.Wait(ctx)
	o.w.call.Unlock()
	o.w.opened(true, n, o.key)

	return n, err
}

// opened counts an open's answer.
func (w *stressModel) opened(async bool, reused int, key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if async {
		w.n.asyncOpens++
	} else {
		w.n.opens++
	}
	if reused > 0 {
		w.n.reusing++
		w.n.reusedTokens += reused
		if key != "" {
			w.n.keyed++
		}
	}
}

func (w *stressModel) counts() stressCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// stressLog records what the engine and the batcher log: the steps the
// engine refused for want of blocks, and every warning or error.
type stressLog struct {
	mu    sync.Mutex
	oom   int
	warns []string
}

func (l *stressLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *stressLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Message == "engine out of blocks: preempting" {
		l.oom++
	}
	if r.Level >= slog.LevelWarn {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		l.warns = append(l.warns, b.String())
	}
	return nil
}

func (l *stressLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *stressLog) WithGroup(string) slog.Handler      { return l }

func (l *stressLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.oom, l.warns = 0, nil
}

func (l *stressLog) oomSteps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.oom
}

func (l *stressLog) problems() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.warns)
}
