package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

// The LoRA mode (-adapters N): decode tokens/s with the batch spread over
// N adapters beside the base alone, adapter load times, and the adapter's
// greedy tokens against the checkpoint with it merged in.
var (
	adapters    = flag.Int("adapters", 0, "LoRA mode: N adapters of -adapter-rank over the checkpoint (0: off)")
	adapterRank = flag.Int("adapter-rank", 16, "LoRA mode: the adapters' rank")
	adapterMax  = flag.Int("adapter-max-rank", 0, "LoRA mode: ModelSpec.MaxAdapterRank, the slots' rank (0: -adapter-rank)")
	adapterTok  = flag.Int("adapter-check", 64, "LoRA mode: greedy tokens compared with the merged checkpoint (0: no check)")
	adapterSlot = flag.Int("adapter-slots", 0, "LoRA mode: ModelSpec.AdapterSlots (0: -adapters); more slots than adapters measure what idle slots cost")
	adapterCmp  = flag.Bool("adapter-dense-too", false, "LoRA mode: another engine with the dense delta over every slot (Tuning.DenseLoRA) beside the default, measured alternating")
	adapterSide = flag.Bool("adapter-no-side-too", false, "LoRA mode: another engine with each shrink on the step's own stream (Tuning.NoLoRASideStream) beside the default, measured alternating")
)

// adapterMode writes -adapters adapters (and the first one's merged
// checkpoint) beside -dir when missing and prints the LoRA tables.
func adapterMode(ctx context.Context, cfg testmodel.Config, logger *slog.Logger) {
	n, rank := *adapters, *adapterRank
	maxRank := *adapterMax
	if maxRank == 0 {
		maxRank = rank
	}
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = filepath.Join(*dir+"-lora", "r"+strconv.Itoa(rank)+"-"+strconv.Itoa(i))
		if _, err := os.Stat(filepath.Join(dirs[i], "adapter_config.json")); err != nil {
			must(testmodel.WriteAdapter(dirs[i], cfg, loraFor(rank, i)))
		}
	}
	open := func(name string, set func(*pyproc.Tuning)) adapterRun {
		t := tuningValue()
		set(&t)
		e, err := pyproc.New(ctx, pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithLogger(logger),
			pyproc.WithCUDAGraphs(*graphs), pyproc.WithStartTimeout(5*time.Minute), pyproc.WithLookahead(*lookahead), pyproc.WithTuning(t))
		must(err)
		mi, err := e.Load(ctx, engine.ModelSpec{ID: "base", Path: *dir, ContextLength: 1024, MaxBatch: 64,
			AdapterSlots: max(n, *adapterSlot, 1), MaxAdapterRank: maxRank})
		must(err)
		m := mi.(*pyproc.Model)
		for i, d := range dirs {
			t0 := time.Now()
			info, err := m.AddAdapter(ctx, engine.AdapterSpec{Name: "a" + strconv.Itoa(i), Path: d})
			must(err)
			if i == 0 && name == "default" {
				fmt.Printf("AddAdapter (read and check on the host): %v; %+v\n", time.Since(t0).Round(time.Microsecond), info)
			}
		}
		_, err = m.AddAdapter(ctx, engine.AdapterSpec{Name: "extra", Path: dirs[0]}) // a0's weights under another name
		must(err)
		return adapterRun{name, t, e, m}
	}
	runs := []adapterRun{open("default", func(*pyproc.Tuning) {})}
	if *adapterCmp {
		runs = append(runs, open("dense", func(t *pyproc.Tuning) { t.DenseLoRA = true }))
	}
	if *adapterSide {
		runs = append(runs, open("no side stream", func(t *pyproc.Tuning) { t.NoLoRASideStream = true }))
	}
	defer func() {
		for _, r := range runs {
			_ = r.m.Close()
			_ = r.e.Close()
		}
	}()
	for _, r := range runs { // each engine's slots filled alike
		if len(runs) > 1 {
			fmt.Printf("%s: ", r.name)
		}
		loadTimes(ctx, r.m, n)
	}
	rounds := 1
	if len(runs) > 1 {
		rounds = 3
	}
	fmt.Printf("\ndecode: prompt %d, %d new tokens, greedy, %d adapters of rank %d in %d slots of rank %d; median of %d rounds, engines alternating\n",
		*prompt, *gen, n, rank, max(n, *adapterSlot, 1), maxRank, rounds)
	fmt.Println("| batch | delta | base only tok/s | one adapter tok/s | spread over adapters tok/s | one/base | spread/base |")
	fmt.Println("|---|---|---|---|---|---|---|")
	none := func(int) string { return "" }
	one := func(int) string { return "a0" }
	spread := func(i int) string { return "a" + strconv.Itoa(i%n) }
	for _, b := range ints(*batches) {
		tps := make([][3][]float64, len(runs))
		for k, pick := range []func(int) string{none, one, spread} {
			for _, r := range runs {
				decodeWith(ctx, r.m, b, *gen, pick) // warm-up (graphs)
			}
			for range rounds {
				for i, r := range runs {
					tps[i][k] = append(tps[i][k], decodeWith(ctx, r.m, b, *gen, pick))
				}
			}
		}
		for i, r := range runs {
			base, o, sp := median(tps[i][0]), median(tps[i][1]), median(tps[i][2])
			fmt.Printf("| %d | %s | %.1f | %.1f | %.1f | %.3f | %.3f |\n", b, r.name, base, o, sp, o/base, sp/base)
		}
	}
	prefillAdapters(ctx, runs, n)
	if *adapterTok > 0 {
		for _, r := range runs {
			if len(runs) > 1 {
				fmt.Printf("%s: ", r.name)
			}
			checkMerged(ctx, r, cfg, rank)
		}
	}
}

// adapterRun is one engine of the LoRA mode: its delta, the engine and
// its model.
type adapterRun struct {
	name string
	t    pyproc.Tuning // the engine's, which the eager check runs with too
	e    *pyproc.Engine
	m    *pyproc.Model
}

// prefillAdapters prints prompt steps with the prompts spread over the
// adapters beside the base alone: the first step of each shape (its
// prompt-step graphs captured then, where they run) and the median of
// five more, in prompt tokens/s. The shapes fill 7/8 of the loaded
// context: 1x896 and 4x448 (1,792 tokens in one step) at 1,024.
func prefillAdapters(ctx context.Context, runs []adapterRun, n int) {
	fmt.Printf("\nprompt steps, %d adapters: first step, then tokens/s (median of 5; engines alternating)\n", n)
	fmt.Println("| prompts | delta | base first | base tok/s | spread first | spread tok/s | spread/base |")
	fmt.Println("|---|---|---|---|---|---|---|")
	long := runs[0].m.Info().ContextLength * 7 / 8
	for _, c := range []prefillCase{{name: fmt.Sprintf("1x%d", long), b: 1, n: long}, {name: fmt.Sprintf("4x%d", long/2), b: 4, n: long / 2}} {
		first := make([][2]time.Duration, len(runs))
		ts := make([][2][]float64, len(runs))
		for k, pick := range []func(int) string{func(int) string { return "" }, func(i int) string { return "a" + strconv.Itoa(i%n) }} {
			for r := range 6 {
				for i, run := range runs {
					m := run.m
					el := promptStep(ctx, m, c, 1000*r, func(id engine.SeqID, toks []int32) (int, error) {
						return m.OpenAdapter(ctx, id, toks, "", pick(int(id)-1))
					})
					if r == 0 {
						first[i][k] = el
						continue
					}
					ts[i][k] = append(ts[i][k], float64(c.b*c.n)/el.Seconds())
				}
			}
		}
		for i, run := range runs {
			b, s := median(ts[i][0]), median(ts[i][1])
			fmt.Printf("| %s | %s | %s | %.0f | %s | %.0f | %.3f |\n", c.name, run.name, ms(first[i][0]), b, ms(first[i][1]), s, s/b)
		}
	}
}

// promptStep times one Step feeding c's prompts whole, prompt i made of
// tokens seed+i, each sequence opened by open (Open, or OpenAdapter with
// its adapter), then frees them.
func promptStep(ctx context.Context, m engine.Model, c prefillCase, seed int, open func(engine.SeqID, []int32) (int, error)) time.Duration {
	batch := make([]engine.StepInput, c.b)
	for i := range batch {
		toks := promptFor(seed+i, c.n, m.Info().VocabSize)
		got, err := open(engine.SeqID(i+1), toks)
		must(err)
		batch[i] = engine.StepInput{Seq: engine.SeqID(i + 1), Tokens: toks[got:], Sample: true, Params: &engine.SamplingParams{}, Last: *prefillLast}
	}
	t0 := time.Now()
	_, err := m.Step(ctx, batch)
	must(err)
	el := time.Since(t0)
	for i := range batch {
		m.Free(batch[i].Seq, "")
	}
	return el
}

// loraFor is adapter i of the benchmark: every projection, bf16.
func loraFor(rank, i int) testmodel.Adapter {
	return testmodel.Adapter{Rank: rank, DType: "bfloat16", Seed: int64(1000 + i)}
}

// loadTimes times the open of a one-token-prompt sequence: with the base,
// with an adapter never resident (its weights read from the file into a
// slot; AddAdapter's check read the file, so it comes from the page
// cache), with it resident, and after its eviction (every slot filled,
// then "extra" takes the least recently used: a0's).
func loadTimes(ctx context.Context, m *pyproc.Model, n int) {
	seq := engine.SeqID(1 << 20)
	open := func(adapter string) time.Duration {
		seq++
		t0 := time.Now()
		_, err := m.OpenAdapter(ctx, seq, []int32{1}, "", adapter)
		must(err)
		el := time.Since(t0)
		m.Free(seq, "")
		return el
	}
	base := open("")
	cold := open("a0")
	warm := open("a0")
	for i := 1; i < n; i++ {
		open("a" + strconv.Itoa(i))
	}
	open("extra")
	reload := open("a0")
	fmt.Printf("open: base %v, adapter first (load from file) %v, resident %v, after eviction (load again) %v\n", base, cold, warm, reload)
}

// checkMerged decodes -adapter-check greedy tokens with adapter a0 (on
// the decode graphs captured with the delta, where they run), with the
// checkpoint that has it merged (written beside -dir when missing), and
// with a0 on an engine without CUDA graphs (the eager path),
// all in the engine's dtype, and prints where they first differ (bf16
// roundings differ between W x + B A x and (W + B A) x, and between the
// dense and the per-adapter GEMMs, so a late divergence is expected;
// one in the first few tokens is a bug).
func checkMerged(ctx context.Context, r adapterRun, cfg testmodel.Config, rank int) {
	e, m := r.e, r.m
	md := *dir + "-lora/merged-r" + strconv.Itoa(rank) + "-0"
	if _, err := os.Stat(filepath.Join(md, "config.json")); err != nil {
		mc := cfg
		ad := loraFor(rank, 0)
		mc.Merge = &ad
		t0 := time.Now()
		must(testmodel.Write(md, mc))
		fmt.Printf("wrote %s in %v\n", md, time.Since(t0).Round(time.Millisecond))
	}
	lens := []int{7, 300}
	var got, base, want, eager [][]int32
	for _, pl := range lens {
		toks := promptFor(3, pl, m.Info().VocabSize)
		got = append(got, greedyOf(ctx, m, toks, *adapterTok, "a0"))
		base = append(base, greedyOf(ctx, m, toks, *adapterTok, ""))
	}
	ref, err := e.Load(ctx, engine.ModelSpec{ID: "merged", Path: md, ContextLength: 1024, MaxBatch: 8})
	must(err)
	for _, pl := range lens {
		want = append(want, greedyOf(ctx, ref.(*pyproc.Model), promptFor(3, pl, m.Info().VocabSize), *adapterTok, ""))
	}
	must(ref.Close())
	ee, err := pyproc.New(ctx, pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithCUDAGraphs(false),
		pyproc.WithStartTimeout(5*time.Minute), pyproc.WithLookahead(1), pyproc.WithTuning(r.t))
	must(err)
	defer ee.Close()
	em, err := ee.Load(ctx, engine.ModelSpec{ID: "eager", Path: *dir, ContextLength: 1024, MaxBatch: 8, MaxAdapterRank: m.Info().MaxAdapterRank})
	must(err)
	defer em.Close()
	_, err = em.(*pyproc.Model).AddAdapter(ctx, engine.AdapterSpec{Name: "a0", Path: *dir + "-lora/r" + strconv.Itoa(rank) + "-0"})
	must(err)
	for i, pl := range lens {
		eager = append(eager, greedyOf(ctx, em.(*pyproc.Model), promptFor(3, pl, m.Info().VocabSize), *adapterTok, "a0"))
		fmt.Printf("prompt %d, %d tokens: first difference adapter/merged %d, adapter eager/merged %d, adapter/adapter eager %d, base/merged %d\n",
			pl, len(want[i]), firstDiff(got[i], want[i]), firstDiff(eager[i], want[i]), firstDiff(got[i], eager[i]), firstDiff(base[i], want[i]))
	}
}

func greedyOf(ctx context.Context, m *pyproc.Model, p []int32, n int, adapter string) []int32 {
	const seq = 1 << 21
	r, err := m.OpenAdapter(ctx, seq, p, "", adapter)
	must(err)
	defer m.Free(seq, "")
	var out []int32
	feed := p[r:]
	for len(out) < n {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: &engine.SamplingParams{}}})
		must(err)
		out = append(out, o[0].Token)
		feed = []int32{o[0].Token}
	}
	return out
}

// firstDiff is the first index where a and b differ, len(a) when none.
func firstDiff(a, b []int32) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
