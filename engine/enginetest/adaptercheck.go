package enginetest

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// AdapterCase is one adapter RunAdapters serves: its directory and,
// when known, the checkpoint with the adapter merged into its weights
// (testmodel.Config.Merge), whose greedy tokens the adapter's must equal.
type AdapterCase struct {
	Dir    string
	Merged string
}

// RunAdapters runs the LoRA adapter checks against eng, loading the
// checkpoint in dir (the model must be an engine.AdapterModel) and
// serving adapters over it; at least two adapters are needed. Each check
// is a subtest -run can pick: adapter_info (AddAdapter describes it,
// Adapters lists it), adapter_merged (greedy tokens equal the merged
// checkpoint's, where given, and differ from the base's), adapter_mixed
// (base and adapter sequences in the same steps, chunked, each get what
// they get alone), adapter_prefix (KV saved by one adapter's sequence is
// reused by its own only), adapter_slots (one slot: adapters taking turns
// are evicted and reloaded, and an adapter whose slot is in use keeps the
// other out with ErrOutOfMemory), adapter_pinned (a pinned adapter keeps
// its slot; one slot stays unpinned), adapter_warm (engine.AdapterWarmer
// makes an adapter resident without a sequence, where the model
// implements it), adapter_remove (a removed adapter opens no more
// sequences) and adapter_refusals (bad adapters get a CheckpointError and
// the model still serves). bad lists adapter
// directories that must be refused. Run closes the models it loaded but
// not eng.
func RunAdapters(t *testing.T, eng engine.Engine, dir string, cases []AdapterCase, bad []string) {
	t.Helper()
	if len(cases) < 2 {
		t.Fatalf("enginetest: RunAdapters needs two adapters, got %d", len(cases))
	}
	ctx := context.Background()
	m, err := eng.Load(ctx, engine.ModelSpec{ID: mainID, Path: dir})
	if err != nil {
		t.Fatalf("enginetest: Load(%q): %v", dir, err)
	}
	defer m.Close()
	am, ok := m.(engine.AdapterModel)
	if !ok || m.Info().AdapterSlots <= 0 {
		t.Fatalf("enginetest: model from %q serves no adapters", dir)
	}
	s := &adapterSuite{suite: suite{ctx: ctx, m: m, info: m.Info()}, am: am, eng: eng, dir: dir, cases: cases, bad: bad}
	for i, c := range cases {
		s.names = append(s.names, "conformance-adapter-"+string(rune('a'+i)))
		if _, err := am.AddAdapter(ctx, engine.AdapterSpec{Name: s.names[i], Path: c.Dir}); err != nil {
			t.Fatalf("AddAdapter(%q): %v", c.Dir, err)
		}
	}
	for _, c := range []struct {
		name  string
		check func(testing.TB, *adapterSuite)
	}{
		{"adapter_info", checkAdapterInfo},
		{"adapter_merged", checkAdapterMerged},
		{"adapter_mixed", checkAdapterMixed},
		{"adapter_prefix", checkAdapterPrefix},
		{"adapter_slots", checkAdapterSlots},
		{"adapter_pinned", checkAdapterPinned},
		{"adapter_warm", checkAdapterWarm},
		{"adapter_remove", checkAdapterRemove},
		{"adapter_refusals", checkAdapterRefusals},
	} {
		t.Run(c.name, func(t *testing.T) { c.check(t, s) })
	}
}

type adapterSuite struct {
	suite
	am    engine.AdapterModel
	eng   engine.Engine
	dir   string
	cases []AdapterCase
	bad   []string
	names []string
}

// aloneWith generates n greedy tokens for prompt with adapter (empty: the
// base) on m, alone.
func (s *adapterSuite) aloneWith(tb testing.TB, m engine.Model, prompt []int32, n int, adapter string) []int32 {
	tb.Helper()
	p := &plan{id: s.id(), prompt: prompt, n: n, adapter: adapter}
	if err := drive(s.ctx, m, []*plan{p}); err != nil {
		tb.Fatalf("generating with adapter %q: %v", adapter, err)
	}
	return p.out
}

func checkAdapterInfo(tb testing.TB, s *adapterSuite) {
	listed := s.am.Adapters()
	for i, name := range s.names {
		j := slices.IndexFunc(listed, func(a engine.AdapterInfo) bool { return a.Name == name })
		if j < 0 {
			tb.Fatalf("Adapters() = %v lacks %q", listed, name)
		}
		a := listed[j]
		if a.Path != s.cases[i].Dir || a.Rank <= 0 || a.Rank > s.info.MaxAdapterRank || len(a.Targets) == 0 || a.Layers <= 0 || a.Bytes <= 0 {
			tb.Errorf("adapter %q described as %+v", name, a)
		}
	}
}

// checkAdapterMerged: an adapter's greedy tokens equal the merged
// checkpoint's and differ from the base's on at least one prompt.
func checkAdapterMerged(tb testing.TB, s *adapterSuite) {
	prompts := [][]int32{s.prompt(300, 7), s.prompt(301, 19), s.prompt(302, 33)}
	for i, c := range s.cases {
		differs := false
		var merged engine.Model
		if c.Merged != "" {
			var err error
			if merged, err = s.eng.Load(s.ctx, engine.ModelSpec{ID: "conformance-merged", Path: c.Merged}); err != nil {
				tb.Fatalf("Load(merged %q): %v", c.Merged, err)
			}
		}
		for _, p := range prompts {
			got := s.aloneWith(tb, s.m, p, 12, s.names[i])
			if base := s.aloneWith(tb, s.m, p, 12, ""); !slices.Equal(got, base) {
				differs = true
			}
			if merged != nil {
				if want := s.aloneWith(tb, merged, p, 12, ""); !slices.Equal(got, want) {
					tb.Errorf("adapter %s, %d-token prompt: %v; the merged checkpoint gives %v", c.Dir, len(p), got, want)
				}
			}
		}
		if merged != nil {
			_ = merged.Close()
		}
		if !differs {
			tb.Errorf("adapter %s gives the base model's tokens on every prompt", c.Dir)
		}
	}
}

// checkAdapterMixed: the base and two adapters in the same steps, chunked
// and joining at different steps, each get what they get alone.
func checkAdapterMixed(tb testing.TB, s *adapterSuite) {
	var plans []*plan
	for i, a := range []string{"", s.names[0], s.names[1], s.names[0], ""} {
		plans = append(plans, &plan{id: s.id(), prompt: s.prompt(310+i, 9+5*i), n: 10, chunk: 7, start: i, adapter: a})
	}
	s.run(tb, s.m, plans...)
	for _, p := range plans {
		if want := s.aloneWith(tb, s.m, p.prompt, p.n, p.adapter); !slices.Equal(p.out, want) {
			tb.Errorf("adapter %q batched with others: %v; alone %v", p.adapter, p.out, want)
		}
	}
}

// checkAdapterPrefix: KV saved under a key by one adapter's sequence is
// reused by a later sequence of that adapter, never by another adapter's
// or the base's.
func checkAdapterPrefix(tb testing.TB, s *adapterSuite) {
	first := &plan{id: s.id(), prompt: s.prompt(320, 12), n: 6, save: "conformance-adapter-turn", adapter: s.names[0]}
	s.run(tb, s.m, first)
	next := append(first.history(), s.prompt(321, 5)...)
	for _, c := range []struct {
		adapter string
		reuses  bool
	}{{s.names[1], false}, {"", false}, {s.names[0], true}} {
		p := &plan{id: s.id(), prompt: next, n: 6, key: first.save, adapter: c.adapter}
		s.run(tb, s.m, p)
		if c.reuses != (p.reused > 0) {
			tb.Errorf("KV saved by adapter %q's sequence: a sequence of %q reused %d tokens", s.names[0], c.adapter, p.reused)
		}
		if want := s.aloneWith(tb, s.m, next, 6, c.adapter); !slices.Equal(p.out, want) {
			tb.Errorf("adapter %q after the save: %v; alone %v", c.adapter, p.out, want)
		}
	}
}

// checkAdapterSlots: on a model with one slot, adapters taking turns are
// reloaded and give the same tokens; one whose sequence is open keeps the
// other out with ErrOutOfMemory until it is freed.
func checkAdapterSlots(tb testing.TB, s *adapterSuite) {
	one, err := s.eng.Load(s.ctx, engine.ModelSpec{ID: "conformance-one-slot", Path: s.dir, AdapterSlots: 1})
	if err != nil {
		tb.Fatalf("Load with one adapter slot: %v", err)
	}
	defer one.Close()
	oam := one.(engine.AdapterModel)
	if got := one.Info().AdapterSlots; got != 1 {
		tb.Errorf("Info().AdapterSlots = %d; the spec asked for 1", got)
	}
	for i, name := range s.names[:2] {
		if _, err := oam.AddAdapter(s.ctx, engine.AdapterSpec{Name: name, Path: s.cases[i].Dir}); err != nil {
			tb.Fatalf("AddAdapter: %v", err)
		}
	}
	p := s.prompt(330, 11)
	want := [2][]int32{s.aloneWith(tb, s.m, p, 8, s.names[0]), s.aloneWith(tb, s.m, p, 8, s.names[1])}
	for turn := range 4 {
		if got := s.aloneWith(tb, one, p, 8, s.names[turn%2]); !slices.Equal(got, want[turn%2]) {
			tb.Errorf("turn %d, adapter %q in the one slot: %v; want %v", turn, s.names[turn%2], got, want[turn%2])
		}
	}
	held := s.id()
	if _, err := oam.OpenAdapter(s.ctx, held, p, "", s.names[0]); err != nil {
		tb.Fatalf("OpenAdapter: %v", err)
	}
	if _, err := oam.OpenAdapter(s.ctx, s.id(), p, "", s.names[1]); !errors.Is(err, engine.ErrOutOfMemory) {
		tb.Errorf("OpenAdapter of a second adapter while the one slot is in use: %v; want ErrOutOfMemory", err)
	}
	if got := s.aloneWith(tb, one, p, 8, ""); len(got) != 8 {
		tb.Errorf("the base beside a held slot generated %v", got)
	}
	one.Free(held, "")
	if got := s.aloneWith(tb, one, p, 8, s.names[1]); !slices.Equal(got, want[1]) {
		tb.Errorf("adapter %q once the slot was freed: %v; want %v", s.names[1], got, want[1])
	}
}

// checkAdapterPinned: with two slots, a pinned adapter keeps its slot (a
// third adapter waits with ErrOutOfMemory while the second is in use, then
// takes the second's slot), a second pin is refused (one slot stays for
// the others) and leaves nothing behind, and the name added again
// unpinned lets the slot go.
func checkAdapterPinned(tb testing.TB, s *adapterSuite) {
	two, err := s.eng.Load(s.ctx, engine.ModelSpec{ID: "conformance-pinned", Path: s.dir, AdapterSlots: 2})
	if err != nil {
		tb.Fatalf("Load with two adapter slots: %v", err)
	}
	defer two.Close()
	am := two.(engine.AdapterModel)
	a, b, c := "pinned-a", "pinned-b", "pinned-c"
	info, err := am.AddAdapter(s.ctx, engine.AdapterSpec{Name: a, Path: s.cases[0].Dir, Pinned: true})
	if err != nil || !info.Pinned {
		tb.Fatalf("AddAdapter pinned: %+v, %v", info, err)
	}
	for _, x := range []struct{ name, dir string }{{b, s.cases[1].Dir}, {c, s.cases[0].Dir}} {
		if _, err := am.AddAdapter(s.ctx, engine.AdapterSpec{Name: x.name, Path: x.dir}); err != nil {
			tb.Fatalf("AddAdapter(%q): %v", x.name, err)
		}
	}
	var inv *engine.InvalidParamError
	if _, err := am.AddAdapter(s.ctx, engine.AdapterSpec{Name: "pinned-x", Path: s.cases[1].Dir, Pinned: true}); !errors.As(err, &inv) {
		tb.Errorf("a second pin with two slots: %v; want an InvalidParamError", err)
	}
	listed := am.Adapters()
	if slices.ContainsFunc(listed, func(x engine.AdapterInfo) bool { return x.Name == "pinned-x" }) ||
		!slices.ContainsFunc(listed, func(x engine.AdapterInfo) bool { return x.Name == a && x.Pinned }) {
		tb.Errorf("Adapters() = %+v: want %q pinned and no pinned-x", listed, a)
	}
	p := s.prompt(350, 10)
	wantA, wantC := s.aloneWith(tb, two, p, 6, a), s.aloneWith(tb, two, p, 6, c)
	held := s.id()
	if _, err := am.OpenAdapter(s.ctx, held, p, "", b); err != nil {
		tb.Fatalf("OpenAdapter(%q): %v", b, err)
	}
	if _, err := am.OpenAdapter(s.ctx, s.id(), p, "", c); !errors.Is(err, engine.ErrOutOfMemory) {
		tb.Errorf("OpenAdapter(%q) beside a pinned adapter and one in use: %v; want ErrOutOfMemory", c, err)
	}
	two.Free(held, "")
	if got := s.aloneWith(tb, two, p, 6, c); !slices.Equal(got, wantC) {
		tb.Errorf("adapter %q once the unpinned slot was free: %v; want %v", c, got, wantC)
	}
	if got := s.aloneWith(tb, two, p, 6, a); !slices.Equal(got, wantA) {
		tb.Errorf("pinned adapter %q: %v; want %v", a, got, wantA)
	}
	if _, err := am.AddAdapter(s.ctx, engine.AdapterSpec{Name: a, Path: s.cases[0].Dir}); err != nil {
		tb.Fatalf("AddAdapter(%q) again, unpinned: %v", a, err)
	}
	held = s.id()
	if _, err := am.OpenAdapter(s.ctx, held, p, "", b); err != nil {
		tb.Fatalf("OpenAdapter(%q): %v", b, err)
	}
	defer two.Free(held, "")
	if got := s.aloneWith(tb, two, p, 6, c); !slices.Equal(got, wantC) {
		tb.Errorf("adapter %q with %q unpinned: %v; want %v", c, a, got, wantC)
	}
}

// checkAdapterRemove: a removed adapter opens nothing, and removing it
// again or an unknown one is ErrModelNotFound; adding it back serves it.
func checkAdapterRemove(tb testing.TB, s *adapterSuite) {
	name := s.names[len(s.names)-1]
	p := s.prompt(340, 9)
	want := s.aloneWith(tb, s.m, p, 6, name)
	if err := s.am.RemoveAdapter(name); err != nil {
		tb.Fatalf("RemoveAdapter: %v", err)
	}
	if _, err := s.am.OpenAdapter(s.ctx, s.id(), p, "", name); !errors.Is(err, engine.ErrModelNotFound) {
		tb.Errorf("OpenAdapter of a removed adapter: %v; want ErrModelNotFound", err)
	}
	if err := s.am.RemoveAdapter(name); !errors.Is(err, engine.ErrModelNotFound) {
		tb.Errorf("RemoveAdapter twice: %v; want ErrModelNotFound", err)
	}
	if _, err := s.am.AddAdapter(s.ctx, engine.AdapterSpec{Name: name, Path: s.cases[len(s.cases)-1].Dir}); err != nil {
		tb.Fatalf("AddAdapter again: %v", err)
	}
	if got := s.aloneWith(tb, s.m, p, 6, name); !slices.Equal(got, want) {
		tb.Errorf("adapter added back: %v; before %v", got, want)
	}
}

// checkAdapterRefusals: bad adapters and bad specs are refused with typed
// errors, and the base and the served adapters go on.
func checkAdapterRefusals(tb testing.TB, s *adapterSuite) {
	p := s.prompt(350, 8)
	base := s.aloneWith(tb, s.m, p, 6, "")
	for _, dir := range append(slices.Clone(s.bad), tb.TempDir()) {
		_, err := s.am.AddAdapter(s.ctx, engine.AdapterSpec{Name: "conformance-bad", Path: dir})
		var ce *engine.CheckpointError
		if !errors.As(err, &ce) {
			tb.Errorf("AddAdapter(%q): %v; want a CheckpointError", dir, err)
		}
	}
	if _, err := s.am.AddAdapter(s.ctx, engine.AdapterSpec{Name: "", Path: s.cases[0].Dir}); !errors.Is(err, engine.ErrInvalidParam) {
		tb.Errorf("AddAdapter without a name: %v; want ErrInvalidParam", err)
	}
	if _, err := s.am.OpenAdapter(s.ctx, s.id(), p, "", "conformance-bad"); !errors.Is(err, engine.ErrModelNotFound) {
		tb.Errorf("OpenAdapter of a refused adapter: %v; want ErrModelNotFound", err)
	}
	if got := s.aloneWith(tb, s.m, p, 6, ""); !slices.Equal(got, base) {
		tb.Errorf("the base after refusals: %v; before %v", got, base)
	}
	if got := s.aloneWith(tb, s.m, p, 6, s.names[0]); len(got) != 6 {
		tb.Errorf("adapter %q after refusals generated %v", s.names[0], got)
	}
}

// WriteAdapterFixture writes what RunAdapters needs for the model cfg
// describes (float32 for exact comparisons): its checkpoint, two adapters
// of it — PEFT's layout at rank 4 over every projection, and mlx-lm's at
// rank 8 over the attention of the last layer — with the checkpoints
// that have them merged, and adapters the model must refuse: rank 128
// (above the default highest), one of a wider model, and one with a NaN
// weight.
func WriteAdapterFixture(tb testing.TB, cfg testmodel.Config) (dir string, cases []AdapterCase, bad []string) {
	tb.Helper()
	root := tb.TempDir()
	write := func(name string, c testmodel.Config) string {
		p := filepath.Join(root, name)
		if err := testmodel.Write(p, c); err != nil {
			tb.Fatal(err)
		}
		return p
	}
	adapter := func(name string, c testmodel.Config, a testmodel.Adapter) string {
		p := filepath.Join(root, name)
		if err := testmodel.WriteAdapter(p, c, a); err != nil {
			tb.Fatal(err)
		}
		return p
	}
	dir = write("base", cfg)
	last := cfg
	if last.Layers == 0 {
		last.Layers = testmodel.Tiny().Layers
	}
	for i, a := range []testmodel.Adapter{
		{Rank: 4, Seed: 1},
		{Rank: 8, Seed: 2, MLX: true, Layers: []int{last.Layers - 1}, Targets: testmodel.AdapterTargets(cfg.Arch)[:2]},
	} {
		cases = append(cases, writeCase(tb, root, strconv.Itoa(i), cfg, a))
	}
	wide := cfg
	wide.Hidden, wide.Intermediate = 2*max(cfg.Hidden, testmodel.Tiny().Hidden), 2*max(cfg.Intermediate, testmodel.Tiny().Intermediate)
	nan := adapter("nan", cfg, testmodel.Adapter{Rank: 2, Seed: 3})
	st := filepath.Join(nan, "adapter_model.safetensors")
	raw, err := os.ReadFile(st)
	if err != nil {
		tb.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	binary.LittleEndian.PutUint32(raw[8+n+4:], math.Float32bits(float32(math.NaN())))
	if err := os.WriteFile(st, raw, 0o644); err != nil {
		tb.Fatal(err)
	}
	bad = []string{adapter("rank128", cfg, testmodel.Adapter{Rank: 128}), adapter("wide", wide, testmodel.Adapter{}), nan}
	return dir, cases, bad
}

// WriteAdapterCase writes into fresh directories cfg's checkpoint, adapter
// a over it, and cfg with a merged into its weights: the base an engine
// loads, the adapter it serves and the checkpoint whose greedy tokens the
// adapter's must equal.
func WriteAdapterCase(tb testing.TB, cfg testmodel.Config, a testmodel.Adapter) (base string, c AdapterCase) {
	tb.Helper()
	root := tb.TempDir()
	base = filepath.Join(root, "base")
	if err := testmodel.Write(base, cfg); err != nil {
		tb.Fatal(err)
	}
	return base, writeCase(tb, root, "", cfg, a)
}

// writeCase writes adapter a of cfg and cfg with a merged into
// root/adapterSUFFIX and root/mergedSUFFIX.
func writeCase(tb testing.TB, root, suffix string, cfg testmodel.Config, a testmodel.Adapter) AdapterCase {
	tb.Helper()
	c := AdapterCase{Dir: filepath.Join(root, "adapter"+suffix), Merged: filepath.Join(root, "merged"+suffix)}
	merged := cfg
	merged.Merge = &a
	for _, err := range []error{testmodel.WriteAdapter(c.Dir, cfg, a), testmodel.Write(c.Merged, merged)} {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return c
}
