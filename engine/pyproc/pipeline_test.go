package pyproc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// pipeEngine is newEngine with lookahead off, which CUDA turns on by
// default (defaultLookaheadCUDA): StepAsync leaves the batches lookahead
// serves, up to lookaheadMaxBatch inputs, to Step.
func pipeEngine(t *testing.T, opts ...Option) *Engine {
	t.Helper()
	return newEngine(t, append([]Option{WithLookahead(1)}, opts...)...)
}

// pipeSeq is one sequence of pipeScript: it joins at step join with a
// prompt fed in chunks of up to 5 tokens, and leaves after gen tokens, a
// stop the caller sees only once it has the token (so a pipelined caller
// has put it in the next step already: a wasted row).
type pipeSeq struct {
	prompt []int32
	join   int
	gen    int
	params *engine.SamplingParams
}

// pipeSeqs are six sequences joining at different steps, with the
// sampling parameters given in turn.
func pipeSeqs(params []*engine.SamplingParams) []pipeSeq {
	seqs := []pipeSeq{
		{prompt(1, 9), 0, 9, nil},
		{prompt(2, 4), 0, 4, nil},
		{prompt(3, 13), 1, 7, nil},
		{prompt(4, 6), 3, 5, nil},
		{prompt(5, 11), 4, 8, nil},
		{prompt(6, 7), 6, 3, nil},
	}
	for i := range seqs {
		seqs[i].params = params[i%len(params)]
	}
	return seqs
}

// pipeLog is what a caller of pipeScript saw, per sequence.
type pipeLog struct {
	toks [][]int32
	lps  [][]float32
	top  [][]string
	// wasted counts outputs of sequences freed while their step was out;
	// async counts the steps StepAsync took.
	wasted, async int
}

// same reports whether b saw what a saw: the same tokens and top
// log-probabilities' tokens, log-probabilities within 1e-4 (a row in a
// step of another shape rounds its sums differently).
func (a pipeLog) same(b pipeLog) error {
	for i := range a.toks {
		if !slices.Equal(a.toks[i], b.toks[i]) || !slices.Equal(a.top[i], b.top[i]) {
			return fmt.Errorf("sequence %d: tokens %v top %v, want %v top %v", i+1, b.toks[i], b.top[i], a.toks[i], a.top[i])
		}
		for j := range a.lps[i] {
			if math.Abs(float64(a.lps[i][j]-b.lps[i][j])) > 1e-4 {
				return fmt.Errorf("sequence %d: logprobs %v, want %v", i+1, b.lps[i], a.lps[i])
			}
		}
	}
	return nil
}

// pipeScript runs seqs on m with Step (pipelined false) or as a
// pipelining caller does (engine.Pipeliner): step N+1 is sent before
// step N's outputs are read, feeding Prev to every sequence that samples
// in N, sequences open with OpenAsync, and a sequence that stops at N is
// freed while N+1, which holds it, is out.
func pipeScript(t *testing.T, m *Model, seqs []pipeSeq, pipelined bool, base engine.SeqID) pipeLog {
	t.Helper()
	ctx := context.Background()
	n := len(seqs)
	log := pipeLog{toks: make([][]int32, n), lps: make([][]float32, n), top: make([][]string, n)}
	fed := make([]int, n)
	open, done := make([]bool, n), make([]bool, n)
	sampled := map[engine.SeqID]bool{} // sequences sampling in the pending step
	var pend engine.PendingStep
	var pendBatch []engine.StepInput
	deliver := func(batch []engine.StepInput, outs []engine.StepOutput) {
		k := 0
		for _, in := range batch {
			if !in.Sample {
				continue
			}
			o := outs[k]
			k++
			i := int(in.Seq - base)
			if o.Seq != in.Seq {
				t.Fatalf("output for sequence %d, want %d", o.Seq, in.Seq)
			}
			if done[i] {
				log.wasted++
				continue
			}
			log.toks[i] = append(log.toks[i], o.Token)
			log.lps[i] = append(log.lps[i], o.Logprob)
			top := make([]int32, len(o.Top))
			for j, x := range o.Top {
				top[j] = x.Token
			}
			log.top[i] = append(log.top[i], fmt.Sprint(top))
			if len(log.toks[i]) == seqs[i].gen {
				done[i] = true
				m.Free(in.Seq, "")
			}
		}
		if k != len(outs) {
			t.Fatalf("%d outputs for %d sampling inputs", len(outs), k)
		}
	}
	for step := 0; ; step++ {
		for i, q := range seqs {
			if q.join != step {
				continue
			}
			var reused int
			var err error
			if pipelined {
				po, ok := m.OpenAsync(ctx, base+engine.SeqID(i), q.prompt, "")
				if !ok {
					t.Fatal("OpenAsync refused a base-model open")
				}
				reused, err = po.Wait(ctx)
			} else {
				reused, err = m.Open(ctx, base+engine.SeqID(i), q.prompt, "")
			}
			if err != nil {
				t.Fatal(err)
			}
			fed[i], open[i] = reused, true
		}
		var batch []engine.StepInput
		for i, q := range seqs {
			id := base + engine.SeqID(i)
			if !open[i] || done[i] {
				continue
			}
			in := engine.StepInput{Seq: id, Sample: true, Params: q.params}
			switch {
			case fed[i] < len(q.prompt):
				end := min(fed[i]+5, len(q.prompt))
				in.Tokens, in.Sample = q.prompt[fed[i]:end], end == len(q.prompt)
				fed[i] = end
			case pipelined && sampled[id]:
				in.Prev = true
			default:
				in.Tokens = []int32{log.toks[i][len(log.toks[i])-1]}
			}
			batch = append(batch, in)
		}
		if !pipelined {
			if len(batch) > 0 {
				outs, err := m.Step(ctx, batch)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				deliver(batch, outs)
			}
		} else {
			var next engine.PendingStep
			if len(batch) > 0 {
				var ok bool
				var err error
				if next, ok, err = m.StepAsync(ctx, batch); err != nil || !ok {
					t.Fatalf("step %d: StepAsync: ok %v, %v", step, ok, err)
				}
				log.async++
			}
			if pend != nil {
				outs, err := pend.Wait(ctx)
				if err != nil {
					t.Fatalf("step %d: %v", step-1, err)
				}
				deliver(pendBatch, outs)
			}
			pend, pendBatch = next, batch
			clear(sampled)
			for _, in := range batch {
				if in.Sample {
					sampled[in.Seq] = true
				}
			}
		}
		if pend == nil && !slices.Contains(done, false) {
			return log
		}
		if step > 100 {
			t.Fatal("the script does not end")
		}
	}
}

// pipeParams are sampling parameters of every kind a pipelined step
// carries: greedy, seeded temperature with top-k, penalties (the worker
// applies them from the tokens it fed, the resolved one included),
// seeded penalised draws, top log-probabilities and nucleus sampling.
var pipeParams = []*engine.SamplingParams{
	{Logprobs: true},
	{Temperature: 0.9, TopK: 40, Seed: 7, HasSeed: true, Logprobs: true},
	{RepetitionPenalty: 1.3, Logprobs: true},
	{PresencePenalty: 0.6, FrequencyPenalty: 0.4, Temperature: 0.8, Seed: 5, HasSeed: true},
	{TopLogprobs: 3, Logprobs: true},
	{Temperature: 0.7, TopP: 0.9, MinP: 0.05, Seed: 3, HasSeed: true},
}

// TestPipelineSameTokens checks that pipelined steps (step N+1 sent
// before step N's tokens are read, with Prev rows) give exactly what
// synchronous steps give, on two workers (each request names the request
// before it on its own worker): sequences joining with prompt chunks
// beside decodes, leaving with a wasted row freed while its step is out,
// and every kind of sampling parameters. On CUDA it also checks that the
// worker's speculated step served the null rows, with parameters that
// let it run.
func TestPipelineSameTokens(t *testing.T) {
	e := pipeEngine(t, WithWorkers(2))
	m := load(t, e, tiny(t))
	if !m.pipelines {
		t.Fatal("the workers' handshakes do not list pipeline")
	}
	seqs := pipeSeqs(pipeParams)
	want := pipeScript(t, m, seqs, false, 100)
	got := pipeScript(t, m, seqs, true, 200)
	if err := want.same(got); err != nil {
		t.Fatal(err)
	}
	if got.wasted != len(seqs) || want.wasted != 0 {
		t.Errorf("wasted rows: %d pipelined, %d synchronous; want one per sequence and none", got.wasted, want.wasted)
	}
	if m.inflight != 0 || m.pending != nil || len(m.opening) != 0 {
		t.Errorf("after the script: %d out, pending %v, opening %v", m.inflight, m.pending, m.opening)
	}
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		return
	}
	plain := []*engine.SamplingParams{{Logprobs: true}, {Temperature: 0.9, TopK: 40, Seed: 7, HasSeed: true}, greedy}
	sync, piped := load(t, e, tiny(t)), load(t, e, tiny(t))
	seqs = pipeSeqs(plain)
	if err := pipeScript(t, sync, seqs, false, 300).same(pipeScript(t, piped, seqs, true, 400)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		st, _ := workerStatsOf(t, e, piped, i)["speculated"].(map[string]any)
		chained, _ := st["chained"].(float64)
		beside, _ := st["beside"].(float64)
		if chained == 0 || beside == 0 {
			t.Errorf("worker %d: speculated steps %v: want some used whole and some beside prompt chunks", i, st)
		}
	}
}

// TestPipelineNotRun checks that a step sent behind one the worker
// refused (out of blocks on a tiny pool) is not run and changes nothing:
// its Wait returns an error wrapping engine.ErrNotRun, and the sequence
// then samples what it samples without either.
func TestPipelineNotRun(t *testing.T) {
	ctx := context.Background()
	m := loadPool(t, pipeEngine(t), 4)
	p := prompt(7, 20)
	want := generate(t, m, 1, p, 2)
	for _, id := range []engine.SeqID{2, 3} {
		if _, err := m.Open(ctx, id, prompt(int(id), 20), ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stepSeq(m, 3, prompt(3, 20), false); err != nil { // 2 of the 4 blocks
		t.Fatal(err)
	}
	// Step N feeds sequence 2 its prompt and sequence 3 another 40 tokens:
	// 5 blocks; step N+1 feeds sequence 2 the token it sampled in N.
	n, ok, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 2, Tokens: prompt(2, 20), Sample: true, Params: greedy}, {Seq: 3, Tokens: prompt(9, 40)}})
	if err != nil || !ok {
		t.Fatalf("StepAsync: ok %v, %v", ok, err)
	}
	n1, ok, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 2, Prev: true, Sample: true, Params: greedy}})
	if err != nil || !ok {
		t.Fatalf("StepAsync behind it: ok %v, %v", ok, err)
	}
	if _, err := n.Wait(ctx); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("step N: %v, want out of memory", err)
	}
	if _, err := n1.Wait(ctx); !errors.Is(err, engine.ErrNotRun) {
		t.Fatalf("step N+1: %v, want not run", err)
	}
	// Nothing changed: sequence 2 is fed its prompt again and samples
	// what a sequence alone samples.
	m.Free(3, "")
	var got []int32
	feed := prompt(2, 20)
	for range 2 {
		tok, err := stepSeq(m, 2, feed, true)
		if err != nil {
			t.Fatal(err)
		}
		got, feed = append(got, tok), []int32{tok}
	}
	if alone := generate(t, m, 4, prompt(2, 20), 2); !slices.Equal(got, alone) {
		t.Errorf("after the refused steps: %v, want %v", got, alone)
	}
	m.Free(2, "")
	if again := generate(t, m, 5, p, 2); !slices.Equal(again, want) {
		t.Errorf("a new sequence after them: %v, want %v", again, want)
	}
}

// TestPipelinePrevRefused checks Prev's rules: the supervisor refuses a
// Prev input whose sequence does not sample in the pending step (and in
// Step), sending nothing; the worker refuses a null row for a sequence
// with no sampled token to feed, and a step naming a request other than
// its last step, and changes nothing.
func TestPipelinePrevRefused(t *testing.T) {
	ctx := context.Background()
	e := pipeEngine(t)
	m := load(t, e, tiny(t))
	want := generate(t, m, 9, prompt(4, 8), 3)
	feed := openFeed(t, m, 1, prompt(4, 8))
	prev := []engine.StepInput{{Seq: 1, Prev: true, Sample: true, Params: greedy}}
	var bad *engine.InvalidParamError
	if _, err := m.Step(ctx, prev); !errors.As(err, &bad) {
		t.Fatalf("Step with Prev: %v, want an invalid parameter", err)
	}
	if _, _, err := m.StepAsync(ctx, prev); !errors.As(err, &bad) {
		t.Fatalf("Prev with no step pending: %v, want an invalid parameter", err)
	}
	n, _, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 1, Tokens: feed[:3]}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.StepAsync(ctx, prev); !errors.As(err, &bad) {
		t.Fatalf("Prev of a sequence not sampling in the pending step: %v, want an invalid parameter", err)
	}
	if _, err := n.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// The worker's side, in raw requests: the sequence has sampled
	// nothing, so a null row has no token.
	p, err := e.slots[0].current(ctx, e.closing)
	if err != nil {
		t.Fatal(err)
	}
	raw := func(fields string) error {
		_, err := p.call(ctx, "tiny", func(b []byte, id uint64) []byte {
			return fmt.Appendf(b, `{"id":%d,"op":"step","model":%q,%s}`, id, m.handle, fields)
		})
		return err
	}
	if err := raw(`"batch":[[1,null,true,{}]]`); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("null row without a sampled token: %v, want invalid", err)
	}
	if err := raw(`"after":1,"batch":[[1,[5],false,{}]]`); !errors.Is(err, engine.ErrNotRun) {
		t.Fatalf("a step behind request 1: %v, want not run", err)
	}
	var got []int32
	feed = feed[3:]
	for range 3 {
		tok, err := stepSeq(m, 1, feed, true)
		if err != nil {
			t.Fatal(err)
		}
		got, feed = append(got, tok), []int32{tok}
	}
	if !slices.Equal(got, want) {
		t.Errorf("after the refused requests: %v, want %v", got, want)
	}
	m.Free(1, "")
}

// TestPipelineFreeBlocksDoesNotWait checks that FreeBlocks, a Free and an
// asynchronous open return at once while a slow step is out (the
// worker's step_delay), and that the step's reply still decodes for the
// sequence freed meanwhile.
func TestPipelineFreeBlocksDoesNotWait(t *testing.T) {
	ctx := context.Background()
	e := pipeEngine(t, withFaults())
	m := load(t, e, tiny(t))
	for _, id := range []engine.SeqID{1, 2} {
		if _, err := m.Open(ctx, id, prompt(int(id), 20), ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stepSeq(m, 2, prompt(2, 20), true); err != nil {
		t.Fatal(err)
	}
	before := m.FreeBlocks()
	inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 0.5})
	n, ok, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 1, Tokens: prompt(1, 20), Sample: true, Params: greedy}})
	if err != nil || !ok {
		t.Fatalf("StepAsync: ok %v, %v", ok, err)
	}
	start := time.Now()
	m.Free(2, "")
	m.Free(1, "") // in the pending step
	free := m.FreeBlocks()
	po, ok := m.OpenAsync(ctx, 3, prompt(3, 5), "")
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("Free, FreeBlocks and OpenAsync took %v with a step out, want no wait", took)
	}
	if !ok || free != before {
		t.Errorf("while the step is out: OpenAsync ok %v, FreeBlocks %d, want %d (the free not answered yet)", ok, free, before)
	}
	outs, err := n.Wait(ctx)
	if err != nil || len(outs) != 1 || outs[0].Seq != 1 {
		t.Fatalf("the step of a sequence freed while it was out: %v, %v", outs, err)
	}
	if _, err := po.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 0})
	if _, err := stepSeq(m, 3, prompt(3, 5), true); err != nil {
		t.Fatal(err)
	}
	m.Free(3, "")
	if got := m.FreeBlocks(); got != m.Info().KVBlocks {
		t.Errorf("FreeBlocks %d after every sequence left, want %d", got, m.Info().KVBlocks)
	}
}

// TestPipelineWorkerLost checks that a worker killed with two steps and
// an open out fails each Wait with an error wrapping ErrWorkerLost.
func TestPipelineWorkerLost(t *testing.T) {
	ctx := context.Background()
	e := pipeEngine(t, withFaults())
	m := load(t, e, tiny(t))
	feed := openFeed(t, m, 1, prompt(1, 10))
	p := inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 2})
	n, _, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 1, Tokens: feed, Sample: true, Params: greedy}})
	if err != nil {
		t.Fatal(err)
	}
	n1, _, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 1, Prev: true, Sample: true, Params: greedy}})
	if err != nil {
		t.Fatal(err)
	}
	po, ok := m.OpenAsync(ctx, 2, prompt(2, 5), "")
	if !ok {
		t.Fatal("OpenAsync refused")
	}
	time.Sleep(200 * time.Millisecond)
	if err := syscall.Kill(p.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i, w := range []engine.PendingStep{n, n1} {
		if _, err := w.Wait(ctx); !errors.Is(err, engine.ErrWorkerLost) {
			t.Errorf("step %d: %v, want worker lost", i, err)
		}
	}
	if _, err := po.Wait(ctx); !errors.Is(err, engine.ErrWorkerLost) {
		t.Errorf("open: %v, want worker lost", err)
	}
	if _, ok := m.seqs[2]; ok {
		t.Error("the open that failed left its sequence open")
	}
	m.Free(1, "")
}

// TestPipelineOpenFreedBeforeWait checks an asynchronous open freed
// before its Wait: the free goes behind the open, the sequence is closed,
// the slot's count and the pool are back where they were, and the id
// opens again.
func TestPipelineOpenFreedBeforeWait(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	m := load(t, e, tiny(t))
	before := m.FreeBlocks()
	po, ok := m.OpenAsync(ctx, 1, prompt(1, 40), "")
	if !ok {
		t.Fatal("OpenAsync refused")
	}
	m.Free(1, "")
	if _, err := po.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, open := m.seqs[1]; open || e.slots[0].open.Load() != 0 {
		t.Fatalf("after Free and Wait: open %v, slot count %d", open, e.slots[0].open.Load())
	}
	if got := m.FreeBlocks(); got != before {
		t.Errorf("FreeBlocks %d, want %d", got, before)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: []int32{5}, Sample: true}}); !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("a step of the freed sequence: %v, want invalid", err)
	}
	// An open Open would refuse before asking a worker is declined, and
	// Open reports it; the id opens again.
	if _, ok = m.OpenAsync(ctx, 1, prompt(1, m.Info().ContextLength+1), ""); ok {
		t.Fatal("OpenAsync of a prompt past the context: sent")
	}
	var cl *engine.ContextLengthError
	if _, err := m.Open(ctx, 1, prompt(1, m.Info().ContextLength+1), ""); !errors.As(err, &cl) {
		t.Fatalf("an open past the context: %v", err)
	}
	want := generate(t, m, 2, prompt(1, 40), 3)
	if got := generate(t, m, 1, prompt(1, 40), 3); !slices.Equal(got, want) {
		t.Errorf("reopened: %v, want %v", got, want)
	}
}

// TestPipelineLookaheadDeclines checks that StepAsync leaves small
// batches to the lookahead Step runs (WithLookahead), sending nothing.
func TestPipelineLookaheadDeclines(t *testing.T) {
	ctx := context.Background()
	m := load(t, newEngine(t, WithLookahead(4)), tiny(t))
	feed := openFeed(t, m, 1, prompt(1, 10))
	defer m.Free(1, "")
	if p, ok, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 1, Tokens: feed, Sample: true}}); ok || err != nil || p != nil {
		t.Fatalf("StepAsync of one sequence with lookahead 4: ok %v, %v", ok, err)
	}
	if m.inflight != 0 {
		t.Fatal("a declined step counts as out")
	}
}

// TestPipelineTensorParallel runs the pipelined script on a
// tensor-parallel-2 worker: every rank resolves the null rows alike and
// refuses a step behind the wrong request alike (the ranks' collectives
// still line up after it).
func TestPipelineTensorParallel(t *testing.T) {
	python(t)
	needGPUs(t, 2)
	ctx := context.Background()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.TinyFamily("qwen3")); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, WithTensorParallel(2), WithLookahead(1))
	m := loadID(t, e, "tiny", dir)
	seqs := pipeSeqs(pipeParams)
	if err := pipeScript(t, m, seqs, false, 100).same(pipeScript(t, m, seqs, true, 200)); err != nil {
		t.Fatal(err)
	}
	want := generate(t, m, 1, prompt(3, 9), 3)
	p, err := e.slots[0].current(ctx, e.closing)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.call(ctx, "tiny", func(b []byte, id uint64) []byte {
		return fmt.Appendf(b, `{"id":%d,"op":"step","model":%q,"after":1,"batch":[[5,null,true,{}]]}`, id, m.handle)
	}); !errors.Is(err, engine.ErrNotRun) {
		t.Fatalf("a step behind request 1: %v, want not run", err)
	}
	if got := generate(t, m, 2, prompt(3, 9), 3); !slices.Equal(got, want) {
		t.Errorf("after the refused step: %v, want %v", got, want)
	}
}

// TestPipelineOutcome checks how a step's error follows from its
// workers' replies and the step it was sent behind, data-parallel
// workers included: nothing ran (ErrNotRun, ErrOutOfMemory), a failure
// of its own, a part run on one worker while the other's part changed
// nothing (an *engine.PartialStepError that claims neither), and a step
// whose every part ran behind a step that failed on another worker.
func TestPipelineOutcome(t *testing.T) {
	notRun := (&wireError{Code: codeNotRun}).toError("m")
	oom := (&wireError{Code: "out_of_memory"}).toError("m")
	lost := &LostError{Reason: "test"}
	a, b := &proc{}, &proc{}
	for _, tc := range []struct {
		name         string
		errA, errB   error
		behindFailed bool
		want         error // nil: no error; else an errors.Is target
		partial      error // the Err of the *engine.PartialStepError wanted
	}{
		{"both ran", nil, nil, false, nil, nil},
		{"neither ran", notRun, notRun, true, engine.ErrNotRun, nil},
		{"a refusal wins over not run", notRun, oom, true, engine.ErrOutOfMemory, nil},
		{"a failure of its own wins", oom, lost, false, engine.ErrWorkerLost, nil},
		{"a failure of its own beside a part that ran", nil, lost, false, engine.ErrWorkerLost, nil},
		{"ran behind a step that failed elsewhere", nil, nil, true, nil, nil},
		{"one ran, one not", nil, notRun, true, nil, engine.ErrNotRun},
		{"one ran, one refused", nil, oom, false, nil, engine.ErrOutOfMemory},
	} {
		r := &stepRun{order: []*proc{a, b}, groups: map[*proc]*stepGroup{
			a: {idx: []int{0}, err: tc.errA}, b: {idx: []int{1}, err: tc.errB}},
			batch: make([]engine.StepInput, 2), plan: []inPlan{{send: prevRow}, {send: prevRow}}, procs: []*proc{a, b}}
		err := r.outcome(tc.behindFailed)
		var part *engine.PartialStepError
		switch {
		case tc.partial != nil:
			if !errors.As(err, &part) || !errors.Is(part.Err, tc.partial) || !slices.Equal(part.Ran, []bool{true, false}) {
				t.Errorf("%s: %v, want a partial step, the second input left for %v", tc.name, err, tc.partial)
			} else if errors.Is(err, engine.ErrNotRun) || errors.Is(err, engine.ErrOutOfMemory) {
				t.Errorf("%s: %v claims nothing changed", tc.name, err)
			}
		case tc.want == nil:
			if err != nil {
				t.Errorf("%s: %v, want none", tc.name, err)
			}
		case !errors.Is(err, tc.want) || errors.As(err, &part):
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := (&stepRun{}).outcome(true); !errors.Is(err, engine.ErrNotRun) {
		t.Errorf("nothing sent behind a step that failed: %v, want not run", err)
	}
}
