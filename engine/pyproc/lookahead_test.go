package pyproc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// transcript runs a fixed scenario on m and records everything the caller
// sees: sequences joining (chunked prefill) and leaving mid-decode, greedy,
// seeded and penalised sampling with logprobs, a caller feeding a token it
// was not given, and prefix reuse of a sequence freed with tokens decoded
// ahead.
func transcript(t *testing.T, m *Model) transcriptLog {
	return transcriptWith(t, m, []*engine.SamplingParams{
		{Logprobs: true},
		{Temperature: 0.9, TopK: 40, Seed: 7, HasSeed: true, Logprobs: true},
		{RepetitionPenalty: 1.3},
		{Temperature: 0.7, TopP: 0.9, MinP: 0.05, Seed: 3, HasSeed: true},
	})
}

// transcriptLog is what a caller saw: a line per sampled token (and the
// prefix reuse), and the tokens' logprobs in order.
type transcriptLog struct {
	lines []string
	lps   []float64
}

// same reports whether b saw what a saw: the same lines, and logprobs
// within 1e-4 (the same row in steps of another shape rounds its sums
// differently).
func (a transcriptLog) same(b transcriptLog) bool {
	if !slices.Equal(a.lines, b.lines) || len(a.lps) != len(b.lps) {
		return false
	}
	for i := range a.lps {
		if math.Abs(a.lps[i]-b.lps[i]) > 1e-4 {
			return false
		}
	}
	return true
}

// transcriptWith is transcript with the four sequences' sampling
// parameters given.
func transcriptWith(t *testing.T, m *Model, params []*engine.SamplingParams) transcriptLog {
	t.Helper()
	ctx := context.Background()
	var log []string
	var lps []float64
	prompts := [][]int32{prompt(1, 9), prompt(2, 4), prompt(3, 13), prompt(4, 6)}
	fedPrompt := make([]int, len(prompts))
	last := make([][]int32, len(prompts))
	fed := make([][]int32, len(prompts)) // every token each sequence was fed
	open := make([]bool, len(prompts))
	for step := 0; step < 14; step++ {
		var batch []engine.StepInput
		for i, p := range prompts {
			id := engine.SeqID(i + 1)
			if step == i*2 && !open[i] && step < 10 { // staggered joins
				if _, err := m.Open(ctx, id, p, ""); err != nil {
					t.Fatal(err)
				}
				open[i] = true
			}
			if !open[i] {
				continue
			}
			in := engine.StepInput{Seq: id, Params: params[i], Sample: true}
			switch {
			case fedPrompt[i] < len(p): // prefill in chunks of up to 5
				end := min(fedPrompt[i]+5, len(p))
				in.Tokens, in.Sample = p[fedPrompt[i]:end], end == len(p)
				fedPrompt[i] = end
			case step == 7 && i == 1: // feed a token other than the one sampled
				in.Tokens = []int32{(last[i][0] + 1) % 300}
			default:
				in.Tokens = last[i]
			}
			fed[i] = append(fed[i], in.Tokens...)
			batch = append(batch, in)
		}
		outs, err := m.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, in := range batch {
			if !in.Sample {
				continue
			}
			o := outs[k]
			k++
			if o.Seq != in.Seq {
				t.Fatalf("step %d: output for seq %d, want %d", step, o.Seq, in.Seq)
			}
			log = append(log, fmt.Sprintf("step %d seq %d: %d", step, o.Seq, o.Token))
			lps = append(lps, float64(o.Logprob))
			last[o.Seq-1] = []int32{o.Token}
		}
		if k != len(outs) {
			t.Fatalf("step %d: %d outputs for %d sampling inputs", step, len(outs), k)
		}
		if step == 9 { // sequence 1 leaves and saves its KV
			m.Free(1, "one")
			open[0] = false
		}
	}
	for i := range prompts {
		if open[i] {
			m.Free(engine.SeqID(i+1), "")
		}
	}
	// Reuse what sequence 1 saved: every token it was fed, and only those.
	full := append(slices.Clone(fed[0]), 5, 6)
	reused, err := m.Open(ctx, 9, full, "one")
	if err != nil {
		t.Fatal(err)
	}
	log = append(log, fmt.Sprintf("reused %d of %d", reused, len(full)))
	feed := full[reused:]
	for range 5 {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: 9, Tokens: feed, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		log = append(log, fmt.Sprintf("seq 9: %d", o[0].Token))
		feed = []int32{o[0].Token}
	}
	m.Free(9, "")
	return transcriptLog{log, lps}
}

// TestLookaheadSameTokens checks that decoding ahead changes nothing the
// caller sees: the same scenario with lookahead 4 and without gives the
// same tokens, logprobs and prefix reuse.
func TestLookaheadSameTokens(t *testing.T) {
	off := load(t, newEngine(t, WithLookahead(1)), tiny(t))
	on := load(t, newEngine(t, WithLookahead(4)), tiny(t))
	if off.k != 1 || on.k != 4 {
		t.Fatalf("lookahead %d and %d, want 1 and 4", off.k, on.k)
	}
	want, got := transcript(t, off), transcript(t, on)
	if !want.same(got) {
		t.Fatalf("with lookahead:\n%v\nwithout:\n%v", got, want)
	}
}

// TestLookaheadRoundTrips checks that a lone greedy sequence takes one
// worker round trip per 4 decoded tokens with lookahead 4.
func TestLookaheadRoundTrips(t *testing.T) {
	e := newEngine(t, WithLookahead(4))
	m := load(t, e, tiny(t))
	p, err := e.slots[0].current(context.Background(), e.closing)
	if err != nil {
		t.Fatal(err)
	}
	before := p.nextID.Load()
	// Open, the prompt (its token alone), 15 tokens in 4 round trips, free.
	generate(t, m, 1, prompt(5, 10), 16)
	if n := p.nextID.Load() - before; n != 1+1+4+1 {
		t.Fatalf("%d requests for 16 tokens, want 7", n)
	}
	if got, want := generate(t, m, 2, prompt(5, 10), 16), generate(t, load(t, newEngine(t), tiny(t)), 2, prompt(5, 10), 16); !slices.Equal(got, want) {
		t.Fatalf("with lookahead %v, without %v", got, want)
	}
}

// TestLookaheadContextEnd checks that lookahead never runs past the
// context: a sequence decodes to the last position and then gets the
// same context-length error as without lookahead.
func TestLookaheadContextEnd(t *testing.T) {
	run := func(m engine.Model) ([]int32, error) {
		ctx := context.Background()
		if _, err := m.Open(ctx, 1, prompt(3, 10), ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(1, "")
		var out []int32
		feed := prompt(3, 10)
		for {
			o, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed, Sample: true, Params: greedy}})
			if err != nil {
				return out, err
			}
			out = append(out, o[0].Token)
			feed = []int32{o[0].Token}
		}
	}
	spec := engine.ModelSpec{ID: "short", Path: tiny(t), ContextLength: 20}
	var outs [2][]int32
	for i, k := range []int{1, 8} {
		m, err := newEngine(t, WithLookahead(k)).Load(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		var cle *engine.ContextLengthError
		out, err := run(m)
		if !errors.As(err, &cle) || cle.Limit != 20 {
			t.Fatalf("lookahead %d: stepping past the context: %v", k, err)
		}
		outs[i] = out
	}
	if len(outs[0]) != 11 || !slices.Equal(outs[0], outs[1]) {
		t.Fatalf("without lookahead %v, with %v; want 11 equal tokens", outs[0], outs[1])
	}
}

// TestLookaheadBadFields sends the worker lookahead fields no supervisor
// would: taking back more tokens than a sequence holds is refused as an
// invalid request, a nonsense count is clipped, and the model keeps
// working.
func TestLookaheadBadFields(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	ctx := context.Background()
	p, err := e.slots[0].current(ctx, e.closing)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(ctx, 1, prompt(1, 4), ""); err != nil {
		t.Fatal(err)
	}
	step := func(n, back int) (*reply, error) {
		return p.call(ctx, "tiny", func(b []byte, id uint64) []byte {
			return fmt.Appendf(b, `{"id":%d,"op":"step","model":%q,"batch":[[1,[5],true,{},%d,%d]]}`, id, m.handle, n, back)
		})
	}
	if _, err := step(1, 99); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("back past the sequence's tokens: %v, want an invalid-parameter error", err)
	}
	r, err := step(-3, 0)
	if err != nil || len(r.Tokens) != 1 || len(r.More) != 0 {
		t.Fatalf("negative count: %+v, %v; want one token", r, err)
	}
	r, err = step(1000, 0)
	if err != nil || len(r.More) != 1 || len(r.More[0]) != 63 {
		t.Fatalf("count past the limit: %v; want 64 tokens", err)
	}
	m.Free(1, "")
	generate(t, m, 2, prompt(2, 5), 3)
}

// TestOverlapSameTokens checks that the next decode step launched behind
// each step (CUDA only) changes nothing the caller sees, with lookahead
// and without, and that it ran: the worker's stats count speculated steps
// a whole step used and steps with prompt chunks beside them.
func TestOverlapSameTokens(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("the worker speculates steps on CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	// Parameters that run ahead (no repetition penalty): every step can
	// carry a speculation.
	params := []*engine.SamplingParams{
		{Logprobs: true},
		{Temperature: 0.9, TopK: 40, Seed: 7, HasSeed: true, Logprobs: true},
		greedy,
		{Temperature: 0.7, TopP: 0.9, MinP: 0.05, Seed: 3, HasSeed: true},
	}
	for _, k := range []int{1, 4} {
		off := load(t, newEngine(t, WithLookahead(k), WithTuning(Tuning{NoOverlap: true})), tiny(t))
		e := newEngine(t, WithLookahead(k))
		on := load(t, e, tiny(t))
		a, b := transcriptWith(t, off, params), transcriptWith(t, on, params)
		if !a.same(b) {
			t.Errorf("lookahead %d: overlap changed what the caller sees:\n off: %v\n on:  %v", k, a, b)
		}
		st, _ := workerStats(t, e, on)["speculated"].(map[string]any)
		chained, _ := st["chained"].(float64)
		beside, _ := st["beside"].(float64)
		// With lookahead the scenario's rounds end in the buffers (the
		// supervisor hands out the tokens decoded ahead): only without it
		// does every step carry one.
		if k == 1 && (chained == 0 || beside == 0) {
			t.Errorf("lookahead %d: speculated steps %v: want some used whole and some beside prompt chunks", k, st)
		}
	}
}

// TestLookaheadOffForLargeBatches checks that a step of more than
// lookaheadMaxBatch sequences asks for one token each (a round trip per
// step), while a small batch decodes ahead.
func TestLookaheadOffForLargeBatches(t *testing.T) {
	e := newEngine(t, WithLookahead(4))
	m := load(t, e, tiny(t))
	p, err := e.slots[0].current(context.Background(), e.closing)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	trips := func(n int) uint64 {
		batch := make([]engine.StepInput, n)
		for i := range batch {
			id := engine.SeqID(1000*n + i)
			if _, err := m.Open(ctx, id, prompt(i, 6), ""); err != nil {
				t.Fatal(err)
			}
			defer m.Free(id, "")
			batch[i] = engine.StepInput{Seq: id, Tokens: prompt(i, 6), Sample: true, Params: greedy}
		}
		before := p.nextID.Load()
		for range 9 { // the prompts, then 8 tokens each
			outs, err := m.Step(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			for i := range batch {
				batch[i].Tokens = []int32{outs[i].Token}
			}
		}
		return p.nextID.Load() - before
	}
	if got := trips(lookaheadMaxBatch + 1); got != 9 {
		t.Errorf("batch %d: %d round trips for 9 steps, want 9 (no lookahead)", lookaheadMaxBatch+1, got)
	}
	if got := trips(2); got >= 9 {
		t.Errorf("batch 2: %d round trips for 9 steps, want fewer (lookahead 4)", got)
	}
}

// TestPrefillGraphsSameTokens checks that prompt steps on the CUDA graphs
// (whole steps around the paged prompt attention, which must pass its
// load check; bfloat16) sample what the eager prompt steps sample, for
// families whose layers differ (biases, QK norm, Gemma 3's sandwich norms
// and sliding layers, Mistral's window, Phi-3's partial rotary and
// longrope, mixtures of experts on the fused kernels): chunks of three
// lengths in one step, then greedy decoding; and that the graphs ran (the
// worker's stats list their token buckets and say the prompt attention
// is on). Logprobs of the first tokens may differ by rounding:
// the graphs run the projections on the bucket's padded row count, where
// cuBLAS may pick another kernel.
//
// Quantized projections differ by more than rounding between the two
// paths, by design: a padded bucket can cross a product's row threshold
// (int4 in-kernel below 256 rows, a dequantized bfloat16 weight for
// cuBLAS from 256; W8A8 in fp8_mma to 64 rows, torch._scaled_mm beyond),
// and an FP8 activation's e4m3 code can round the other way on a
// bfloat16 difference in its input (a 1/16 step). So for them each
// sequence's logprobs must agree within 0.1 while its tokens agree, and a
// token may differ only at a near tie (the eager path's two most likely
// tokens within 0.1), after which the sequence's inputs differ and its
// comparison ends.
func TestPrefillGraphsSameTokens(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("prompt-step graphs run on CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	ctx := context.Background()
	// run returns each sequence's outputs in order: its prompt's first
	// token, then six decode steps.
	run := func(m engine.Model) [][]engine.StepOutput {
		// Prompt steps of 487 rows (three chunks), then 10, 200 and 100
		// rows alone (buckets 512, 64, 256, 128: quantized products on
		// either side of their row thresholds), then every sequence decodes.
		var seqs [][]engine.StepOutput
		var batch []engine.StepInput
		params := &engine.SamplingParams{Logprobs: true, TopLogprobs: 2}
		for _, lens := range [][]int{{37, 150, 300}, {10}, {200}, {100}} {
			var prompts []engine.StepInput
			for _, n := range lens {
				id := engine.SeqID(len(batch) + len(prompts) + 1)
				p := prompt(int(id)+4, n)
				if _, err := m.Open(ctx, id, p, ""); err != nil {
					t.Fatal(err)
				}
				defer m.Free(id, "")
				prompts = append(prompts, engine.StepInput{Seq: id, Tokens: p, Sample: true, Params: params})
			}
			outs, err := m.Step(ctx, prompts)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range outs {
				seqs = append(seqs, []engine.StepOutput{o})
				prompts[i].Tokens = []int32{o.Token}
			}
			batch = append(batch, prompts...)
		}
		for range 6 {
			outs, err := m.Step(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range outs {
				seqs[i] = append(seqs[i], o)
				batch[i].Tokens = []int32{o.Token}
			}
		}
		return seqs
	}
	// same compares the eager run a with the graphs' run b.
	same := func(arch string, quantized bool, a, b [][]engine.StepOutput) {
		for s := range a {
			for i := range a[s] {
				x, y := a[s][i], b[s][i]
				d := math.Abs(float64(x.Logprob - y.Logprob))
				switch {
				case !quantized && x.Token != y.Token:
					t.Errorf("%s: sequence %d output %d: token %d with prompt-step graphs, %d eager", arch, s+1, i, y.Token, x.Token)
				case !quantized && i < 2 && d > 0.02:
					t.Errorf("%s: sequence %d output %d (its first token or first decode step): logprob %.5f with graphs, %.5f eager", arch, s+1, i, y.Logprob, x.Logprob)
				case quantized && x.Token != y.Token && len(x.Top) < 2:
					t.Errorf("%s: sequence %d output %d: token %d with prompt-step graphs, %d eager; eager's top logprobs %v", arch, s+1, i, y.Token, x.Token, x.Top)
				case quantized && x.Token != y.Token:
					if gap := x.Top[0].Logprob - x.Top[1].Logprob; gap > 0.1 {
						t.Errorf("%s: sequence %d output %d: token %d with prompt-step graphs, %d eager, where eager's top two are %.3f apart", arch, s+1, i, y.Token, x.Token, gap)
					}
				case quantized && d > 0.1:
					t.Errorf("%s: sequence %d output %d: logprob %.5f with graphs, %.5f eager", arch, s+1, i, y.Logprob, x.Logprob)
				}
				if x.Token != y.Token {
					break
				}
			}
		}
	}
	check := func(arch string, quantized bool, off, on *Engine, cfg testmodel.Config) {
		dir := t.TempDir()
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		spec := engine.ModelSpec{ID: arch, Path: dir}
		mOff, err := off.Load(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		mOn, err := on.Load(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		same(arch, quantized, run(mOff), run(mOn))
		st := workerStats(t, on, mOn.(*Model))
		if fmt.Sprint(st["prefill_graphs"]) == "[]" {
			t.Errorf("%s: worker stats: prompt-step graph buckets %v, want some", arch, st["prefill_graphs"])
		}
		// Whole-step graphs: the load check passed for this family's shapes,
		// and prompt steps replayed them.
		if st["prompt_attention"] != true || fmt.Sprint(st["prefill_whole_graphs"]) == "[]" {
			t.Errorf("%s: worker stats: prompt_attention %v, whole-step graph buckets %v; want true and some",
				arch, st["prompt_attention"], st["prefill_whole_graphs"])
		}
	}
	off := newEngine(t, WithDType("bfloat16"), WithTuning(Tuning{NoPrefillGraphs: true}))
	on := newEngine(t, WithDType("bfloat16"))
	for _, arch := range []string{"llama", "qwen2", "qwen3", "gemma3_text", "mistral", "phi3", "qwen3_moe", "mixtral"} {
		check(arch, false, off, on, testmodel.TinyFamily(arch))
	}
	// Quantized projections (FP8 and int4 kept quantized on CUDA): the
	// 487-row step runs their prompt-sized products (W8A8, dequantized
	// int4 for cuBLAS) inside the graphs.
	for _, q := range testmodel.Quants() {
		cfg := testmodel.TinyQuant()
		cfg.Quant = q
		check(q, true, off, on, cfg)
	}
	qoff := newEngine(t, WithDType("bfloat16"), WithQuantize("fp8"), WithTuning(Tuning{NoPrefillGraphs: true}))
	qon := newEngine(t, WithDType("bfloat16"), WithQuantize("fp8"))
	check("quantize-fp8", true, qoff, qon, testmodel.TinyQuant())
}
