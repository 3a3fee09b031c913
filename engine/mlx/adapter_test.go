//go:build mlx

package mlx

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// adapterCase is a base checkpoint, an adapter over it and the checkpoint
// with the adapter merged (the reference).
type adapterCase struct {
	base, adapter, merged string
}

// writeAdapterCase writes cfg, adapter a over it, and cfg with a merged.
func writeAdapterCase(t testing.TB, cfg testmodel.Config, a testmodel.Adapter) adapterCase {
	t.Helper()
	base, c := enginetest.WriteAdapterCase(t, cfg, a)
	return adapterCase{base: base, adapter: c.Dir, merged: c.Merged}
}

func loadSpec(t testing.TB, e *Engine, spec engine.ModelSpec) *model {
	t.Helper()
	if spec.ID == "" {
		spec.ID = "tiny"
	}
	m, err := e.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m.(*model)
}

func addAdapter(t testing.TB, m *model, name, dir string) engine.AdapterInfo {
	t.Helper()
	info, err := m.AddAdapter(context.Background(), engine.AdapterSpec{Name: name, Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// generateAdapter is generate for a sequence of adapter (empty: the base).
func generateAdapter(t testing.TB, m *model, id engine.SeqID, prompt []int32, n, chunk int, adapter string) []int32 {
	t.Helper()
	ctx := context.Background()
	if _, err := m.OpenAdapter(ctx, id, prompt, "", adapter); err != nil {
		t.Fatal(err)
	}
	defer m.Free(id, "")
	var toks []int32
	for i := 0; i < len(prompt); i += chunk {
		end := min(i+chunk, len(prompt))
		out, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: prompt[i:end], Sample: end == len(prompt)}})
		if err != nil {
			t.Fatal(err)
		}
		if end == len(prompt) {
			toks = append(toks, out[0].Token)
		}
	}
	for len(toks) < n {
		out, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: toks[len(toks)-1:], Sample: true}})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, out[0].Token)
	}
	return toks
}

// TestAdapterMatchesMerged: an adapter's greedy tokens are those of the
// checkpoint with it merged, for llama (q/k/v and gate/up fused at load),
// qwen2 (q/k/v biases), phi3 (fused in the checkpoint) and qwen3_moe
// (attention only: the experts are not adapted), in PEFT's and
// mlx-lm's layouts, prefilled whole and in chunks; and they differ from
// the base's, so the adapter is applied at all.
func TestAdapterMatchesMerged(t *testing.T) {
	e := newEngine(t)
	for _, arch := range []string{"llama", "qwen2", "phi3", "qwen3_moe"} {
		for _, mlxLayout := range []bool{false, true} {
			cfg := testmodel.TinyFamily(arch)
			a := testmodel.Adapter{Rank: 4, Alpha: 8, MLX: mlxLayout, Seed: 11}
			if arch == "qwen2" { // some projections only, some layers only, rsLoRA
				a.Targets, a.Layers, a.RSLoRA = []string{"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"}, []int{1}, true
			}
			c := writeAdapterCase(t, cfg, a)
			m := loadSpec(t, e, engine.ModelSpec{Path: c.base})
			ref := loadSpec(t, e, engine.ModelSpec{Path: c.merged})
			info := addAdapter(t, m, "a", c.adapter)
			if info.Rank != 4 || info.Name != "a" || info.Bytes <= 0 {
				t.Errorf("%s: info %+v", arch, info)
			}
			differs := false
			for i, p := range prompts() {
				want := generateAdapter(t, ref, 1, p, 8, len(p), "")
				got := generateAdapter(t, m, 2, p, 8, len(p), "a")
				chunked := generateAdapter(t, m, 3, p, 8, 3, "a")
				base := generateAdapter(t, m, 4, p, 8, len(p), "")
				if !slices.Equal(got, want) || !slices.Equal(chunked, want) {
					t.Errorf("%s mlx=%v prompt %d: adapter %v, chunked %v, merged %v", arch, mlxLayout, i, got, chunked, want)
				}
				differs = differs || !slices.Equal(base, want)
			}
			if !differs {
				t.Errorf("%s mlx=%v: the adapter changes no token", arch, mlxLayout)
			}
		}
	}
}

// TestAdapterBatchMixed: base sequences and sequences of two adapters,
// prompts of different lengths prefilled in chunks while others decode,
// each get in one batch what they get alone; the base's tokens are the
// base model's.
func TestAdapterBatchMixed(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.Tiny()
	c1 := writeAdapterCase(t, cfg, testmodel.Adapter{Rank: 8, Seed: 1})
	c2 := writeAdapterCase(t, cfg, testmodel.Adapter{Rank: 4, MLX: true, Seed: 2, Targets: []string{"self_attn.k_proj", "mlp.up_proj"}})
	m := loadSpec(t, e, engine.ModelSpec{Path: c1.base})
	plain := loadSpec(t, e, engine.ModelSpec{Path: c1.base, ID: "plain"})
	addAdapter(t, m, "x", c1.adapter)
	addAdapter(t, m, "y", c2.adapter)
	ps := append(prompts(), prompts()[2][:7], prompts()[0])
	who := []string{"x", "", "y", "x", "y", ""}
	alone := make([][]int32, len(ps))
	for i, p := range ps {
		alone[i] = generateAdapter(t, m, 1, p, 10, len(p), who[i])
		if who[i] == "" {
			if want := generateAdapter(t, plain, 1, p, 10, len(p), ""); !slices.Equal(alone[i], want) {
				t.Errorf("prompt %d: base with adapters served %v, without %v", i, alone[i], want)
			}
		}
	}
	ctx := context.Background()
	fed, out := make([]int, len(ps)), make([][]int32, len(ps))
	for i, p := range ps {
		if _, err := m.OpenAdapter(ctx, engine.SeqID(100+i), p, "", who[i]); err != nil {
			t.Fatal(err)
		}
		defer m.Free(engine.SeqID(100+i), "")
	}
	for {
		var batch []engine.StepInput
		var sampled []int
		for i, p := range ps {
			switch {
			case fed[i] < len(p):
				end := min(fed[i]+i+1, len(p))
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(100 + i), Tokens: p[fed[i]:end], Sample: end == len(p)})
				fed[i] = end
				if end == len(p) {
					sampled = append(sampled, i)
				}
			case len(out[i]) < 10:
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(100 + i), Tokens: out[i][len(out[i])-1:], Sample: true})
				sampled = append(sampled, i)
			}
		}
		if len(batch) == 0 {
			break
		}
		res, err := m.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for j, i := range sampled {
			out[i] = append(out[i], res[j].Token)
		}
	}
	for i := range ps {
		if !slices.Equal(out[i], alone[i]) {
			t.Errorf("prompt %d (adapter %q): batched %v, alone %v", i, who[i], out[i], alone[i])
		}
	}
	if slices.Equal(alone[0], alone[4]) {
		t.Errorf("adapters x and y gave the same tokens %v", alone[0])
	}
}

// TestAdapterPrefixKVNotShared: KV saved by a sequence of one adapter is
// reused by the same adapter only, never by the base or another adapter
// (or the adapter added again under its name), and the tokens after reuse
// are those of a fresh sequence.
func TestAdapterPrefixKVNotShared(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.Tiny()
	c := writeAdapterCase(t, cfg, testmodel.Adapter{Seed: 3})
	c2 := writeAdapterCase(t, cfg, testmodel.Adapter{Seed: 4})
	m := loadSpec(t, e, engine.ModelSpec{Path: c.base})
	addAdapter(t, m, "x", c.adapter)
	addAdapter(t, m, "y", c2.adapter)
	ctx := context.Background()
	turn1 := prompts()[2]
	turn2 := append(slices.Clone(turn1), 7, 8, 9)
	save := func(id engine.SeqID, adapter, key string) {
		if _, err := m.OpenAdapter(ctx, id, turn1, "", adapter); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: turn1, Sample: true}}); err != nil {
			t.Fatal(err)
		}
		m.Free(id, key)
	}
	reuse := func(id engine.SeqID, adapter, key string, want int) {
		t.Helper()
		r, err := m.OpenAdapter(ctx, id, turn2, key, adapter)
		if err != nil || r != want {
			t.Fatalf("adapter %q reuses %d of key %s (%v), want %d", adapter, r, key, err, want)
		}
		m.Free(id, "")
	}
	save(1, "x", "k")
	reuse(2, "", "k", 0)
	reuse(3, "y", "k", 0)
	reuse(4, "x", "k", len(turn1))
	save(5, "", "base")
	reuse(6, "x", "base", 0)
	reuse(7, "", "base", len(turn1))

	// Tokens after reuse are a fresh sequence's.
	fresh := generateAdapter(t, m, 8, turn2, 5, len(turn2), "x")
	r, err := m.OpenAdapter(ctx, 9, turn2, "k", "x")
	if err != nil || r != len(turn1) {
		t.Fatalf("reuse %d, %v", r, err)
	}
	out, err := m.Step(ctx, []engine.StepInput{{Seq: 9, Tokens: turn2[r:], Sample: true}})
	if err != nil || out[0].Token != fresh[0] {
		t.Fatalf("after reuse %v, %v; fresh %v", out, err, fresh)
	}
	m.Free(9, "")

	// The name added again is another adapter: its KV starts afresh.
	m.EvictedSaved()
	addAdapter(t, m, "x", c2.adapter)
	reuse(10, "x", "k", 0)
	if ev := m.EvictedSaved(); !slices.Contains(ev, "k") {
		t.Errorf("KV of the replaced adapter dropped but not reported: evicted %v", ev)
	}
}

// TestAdapterSlotEviction: with one slot, two adapters one after the
// other are both right (the second evicts the first, which is reloaded);
// while a sequence of one is open the other gets ErrOutOfMemory.
func TestAdapterSlotEviction(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.Tiny()
	cx := writeAdapterCase(t, cfg, testmodel.Adapter{Rank: 4, Seed: 5})
	cy := writeAdapterCase(t, cfg, testmodel.Adapter{Rank: 8, MLX: true, Seed: 6, Targets: []string{"self_attn.q_proj", "mlp.gate_proj"}})
	m := loadSpec(t, e, engine.ModelSpec{Path: cx.base, AdapterSlots: 1})
	if m.Info().AdapterSlots != 1 || m.Info().MaxAdapterRank != engine.DefaultMaxAdapterRank {
		t.Fatalf("info %+v", m.Info())
	}
	if _, err := e.Load(context.Background(), engine.ModelSpec{ID: "many", Path: cx.base, AdapterSlots: maxAdapterSlots + 1}); err == nil {
		t.Error("more adapter slots than gather_mm takes were accepted")
	}
	rx, ry := loadSpec(t, e, engine.ModelSpec{Path: cx.merged, ID: "mx"}), loadSpec(t, e, engine.ModelSpec{Path: cy.merged, ID: "my"})
	addAdapter(t, m, "x", cx.adapter)
	addAdapter(t, m, "y", cy.adapter)
	p := prompts()[0]
	wantX, wantY := generateAdapter(t, rx, 1, p, 8, len(p), ""), generateAdapter(t, ry, 1, p, 8, len(p), "")
	for round := range 2 {
		if got := generateAdapter(t, m, 1, p, 8, len(p), "x"); !slices.Equal(got, wantX) {
			t.Errorf("round %d: x %v, merged %v", round, got, wantX)
		}
		if got := generateAdapter(t, m, 1, p, 8, len(p), "y"); !slices.Equal(got, wantY) {
			t.Errorf("round %d: y %v, merged %v", round, got, wantY)
		}
	}
	ctx := context.Background()
	if _, err := m.OpenAdapter(ctx, 5, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OpenAdapter(ctx, 6, p, "", "y"); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("second adapter with the only slot in use: %v, want ErrOutOfMemory", err)
	}
	if _, err := m.OpenAdapter(ctx, 6, p, "", "x"); err != nil { // the resident one still opens
		t.Fatal(err)
	}
	m.Free(5, "")
	m.Free(6, "")
	if got := generateAdapter(t, m, 7, p, 8, len(p), "y"); !slices.Equal(got, wantY) {
		t.Errorf("after the slot was freed: y %v, merged %v", got, wantY)
	}

	// A removed adapter's open sequence runs on, holding the slot until
	// it is freed.
	if _, err := m.OpenAdapter(ctx, 8, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveAdapter("x"); err != nil {
		t.Fatal(err)
	}
	out, err := m.Step(ctx, []engine.StepInput{{Seq: 8, Tokens: p, Sample: true}})
	if err != nil || out[0].Token != wantX[0] {
		t.Errorf("removed adapter's open sequence: %v, %v; want %d", out, err, wantX[0])
	}
	if _, err := m.OpenAdapter(ctx, 9, p, "", "y"); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Errorf("slot of a removed adapter's open sequence taken: %v", err)
	}
	m.Free(8, "")
	if got := generateAdapter(t, m, 10, p, 8, len(p), "y"); !slices.Equal(got, wantY) {
		t.Errorf("after the removed adapter's sequence: y %v, merged %v", got, wantY)
	}
}

// TestAdapterErrors: adapters that do not fit the model are refused with
// a *engine.CheckpointError and the model goes on serving; a removed
// adapter is not found.
func TestAdapterErrors(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.Tiny()
	c := writeAdapterCase(t, cfg, testmodel.Adapter{Rank: 8, Seed: 7})
	m := loadSpec(t, e, engine.ModelSpec{Path: c.base, MaxAdapterRank: 4})
	root := t.TempDir()
	write := func(name string, base testmodel.Config, a testmodel.Adapter) string {
		dir := filepath.Join(root, name)
		if err := testmodel.WriteAdapter(dir, base, a); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	wide := cfg
	wide.Hidden, wide.Intermediate = 96, 192
	nan := write("nan", cfg, testmodel.Adapter{Rank: 2})
	f, err := os.OpenFile(filepath.Join(nan, "adapter_model.safetensors"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	var bits [4]byte
	v := math.Float32bits(float32(math.NaN()))
	bits[0], bits[1], bits[2], bits[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	if _, err := f.WriteAt(bits[:], st.Size()-4); err != nil {
		t.Fatal(err)
	}
	f.Close()
	bad := map[string]string{
		"shapes":  write("shapes", wide, testmodel.Adapter{Rank: 2}),
		"rank":    c.adapter, // rank 8 above MaxAdapterRank 4
		"nan":     nan,
		"module":  write("module", cfg, testmodel.Adapter{Rank: 2, Targets: []string{"self_attn.qkv_proj"}}),
		"missing": filepath.Join(root, "nothing"),
	}
	ctx := context.Background()
	for name, dir := range bad {
		_, err := m.AddAdapter(ctx, engine.AdapterSpec{Name: name, Path: dir})
		var ce *engine.CheckpointError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a CheckpointError", name, err)
		}
	}
	if _, err := m.AddAdapter(ctx, engine.AdapterSpec{Name: "", Path: c.adapter}); err == nil {
		t.Error("an empty name was accepted")
	}
	if n := len(m.Adapters()); n != 0 {
		t.Errorf("%d adapters served after refusals", n)
	}
	good := write("good", cfg, testmodel.Adapter{Rank: 4, Seed: 8})
	addAdapter(t, m, "good", good)
	p := prompts()[1]
	before := generateAdapter(t, m, 1, p, 6, len(p), "good")
	if _, err := m.OpenAdapter(ctx, 2, p, "", "nan"); !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("open of a refused adapter: %v", err)
	}
	if err := m.RemoveAdapter("good"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OpenAdapter(ctx, 3, p, "", "good"); !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("open of a removed adapter: %v, want ErrModelNotFound", err)
	}
	if err := m.RemoveAdapter("good"); !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("second remove: %v", err)
	}
	addAdapter(t, m, "good", good)
	if again := generateAdapter(t, m, 4, p, 6, len(p), "good"); !slices.Equal(again, before) {
		t.Errorf("re-added adapter %v, before %v", again, before)
	}
	if got := generateAdapter(t, m, 5, p, 6, len(p), ""); len(got) != 6 {
		t.Errorf("base after refusals: %v", got)
	}
}

// TestAdapterRegistryConcurrent: AddAdapter, RemoveAdapter and Adapters
// run while sequences of an adapter step (go test -race).
func TestAdapterRegistryConcurrent(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.Tiny()
	c := writeAdapterCase(t, cfg, testmodel.Adapter{Rank: 4, Seed: 9})
	m := loadSpec(t, e, engine.ModelSpec{Path: c.base})
	addAdapter(t, m, "x", c.adapter)
	p := prompts()[2]
	want := generateAdapter(t, m, 1, p, 6, len(p), "x")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := string(rune('a' + i))
			for range 5 {
				if _, err := m.AddAdapter(context.Background(), engine.AdapterSpec{Name: name, Path: c.adapter}); err != nil {
					errs <- err
					return
				}
				_ = m.Adapters()
				if err := m.RemoveAdapter(name); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range 3 {
		if got := generateAdapter(t, m, engine.SeqID(10+i), p, 6, 2, "x"); !slices.Equal(got, want) {
			t.Errorf("while the registry changes: %v, want %v", got, want)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := m.Adapters(); len(got) != 1 || got[0].Name != "x" {
		t.Errorf("adapters %+v, want x only", got)
	}
}
