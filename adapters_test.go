package mlxserving_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/testmodel"
)

// writeAdapters writes n PEFT adapters of the tiny model into a temporary
// directory and returns their paths.
func writeAdapters(t testing.TB, n int) []string {
	t.Helper()
	var dirs []string
	for i := range n {
		dir := filepath.Join(t.TempDir(), string(rune('a'+i)))
		if err := testmodel.WriteAdapter(dir, testmodel.Tiny(), testmodel.Adapter{Rank: 4, Seed: int64(i)}); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	return dirs
}

func collect(t testing.TB, srv *mlxserving.Server, r api.Request) (api.Result, api.Header) {
	t.Helper()
	st, err := srv.Generate(context.Background(), r)
	if err != nil {
		t.Fatalf("Generate(model %q, adapter %q): %v", r.Model, r.Adapter, err)
	}
	res, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	return res, st.Header()
}

// An adapter is a model with a parent: requests naming it run on the base
// model's engine with the adapter, answer as the adapter, and are listed
// and routed like models.
func TestAdapterServedAsModel(t *testing.T) {
	f := newFixture(t, nil, mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute)))
	dirs := writeAdapters(t, 2)
	ctx := context.Background()
	for i, name := range []string{"sql", "chat"} {
		st, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: name, Path: dirs[i]})
		if err != nil {
			t.Fatal(err)
		}
		if st.Base != "sim" || st.Rank != 4 || st.Path != dirs[i] {
			t.Fatalf("LoadAdapter: %+v", st)
		}
	}
	r := req(10, 3, 4, 5, 6)
	r.Cache = true
	base, hb := collect(t, f.srv, r)
	r.Model = "sql"
	sql, hs := collect(t, f.srv, r)
	r.Model = "chat"
	chat, _ := collect(t, f.srv, r)
	if hb.Model != "sim" || hs.Model != "sql" {
		t.Fatalf("stream models %q and %q; want sim and sql", hb.Model, hs.Model)
	}
	if slices.Equal(base.Tokens, sql.Tokens) || slices.Equal(sql.Tokens, chat.Tokens) {
		t.Fatalf("base %v, sql %v, chat %v: the response cache or the engine mixed adapters", base.Tokens, sql.Tokens, chat.Tokens)
	}
	// The base named with the adapter as a parameter is the same request.
	r.Model, r.Adapter = "sim", "sql"
	if again, _ := collect(t, f.srv, r); !slices.Equal(again.Tokens, sql.Tokens) {
		t.Fatalf("model sim with adapter sql: %v; model sql: %v", again.Tokens, sql.Tokens)
	}
	if got := f.srv.Load().Models; !slices.Equal(got, []string{"chat", "sim", "sql"}) {
		t.Fatalf("Load().Models = %v", got)
	}
	var parents []string
	for _, st := range f.srv.ModelStatus() {
		parents = append(parents, st.ID+"<"+st.Parent)
	}
	if !slices.Equal(parents, []string{"sim<", "chat<sim", "sql<sim"}) {
		t.Fatalf("ModelStatus: %v", parents)
	}
	if _, err := f.srv.Embed(ctx, api.EmbedRequest{Model: "sql", Inputs: []api.EmbedInput{{Tokens: []int32{1, 2}}}}); !errors.Is(err, api.ErrInvalidParam) {
		t.Fatalf("embedding with an adapter: %v", err)
	}
	if err := f.srv.UnloadAdapter(ctx, "sql"); err != nil {
		t.Fatal(err)
	}
	r.Model, r.Adapter = "sql", ""
	if _, err := f.srv.Generate(ctx, r); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("after UnloadAdapter: %v", err)
	}
	if err := f.srv.UnloadAdapter(ctx, "sql"); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("UnloadAdapter twice: %v", err)
	}
}

// Bad adapters and bad specs are refused with typed errors, and the base
// goes on serving.
func TestAdapterRefusals(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	dirs := writeAdapters(t, 1)
	var ce *engine.CheckpointError
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "x", Path: t.TempDir()}); !errors.As(err, &ce) {
		t.Fatalf("an empty directory: %v", err)
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "x", Path: dirs[0], Base: "nope"}); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("an unknown base: %v", err)
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "sim", Path: dirs[0]}); !errors.Is(err, mlxserving.ErrModelExists) {
		t.Fatalf("a model's name: %v", err)
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Path: dirs[0]}); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("no name: %v", err)
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "x", Path: dirs[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "x", Path: dirs[0]}); !errors.Is(err, mlxserving.ErrModelExists) {
		t.Fatalf("a name taken by an adapter: %v", err)
	}
	r := req(4, 1, 2)
	r.Adapter = "nope"
	if _, err := f.srv.Generate(ctx, r); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("an unknown adapter parameter: %v", err)
	}
	r.Model, r.Adapter = "x", "other"
	if _, err := f.srv.Generate(ctx, r); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("an adapter over an adapter: %v", err)
	}
	if res, _ := collect(t, f.srv, req(4, 1, 2)); len(res.Tokens) != 4 {
		t.Fatalf("the base after refusals: %v", res.Tokens)
	}
}

// A pinned adapter is pre-warmed (resident before its first request) and
// says so in its status and the model list; a base pins at most its
// adapter slots less one, and a pin past that is refused without leaving
// the adapter behind.
func TestAdapterPinned(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	dirs := writeAdapters(t, 1)
	slots := engine.DefaultAdapterSlots
	for i := range slots - 1 {
		st, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: fmt.Sprint("pin", i), Path: dirs[0], Pinned: true})
		if err != nil || !st.Pinned {
			t.Fatalf("pin %d: %+v, %v", i, st, err)
		}
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "one-too-many", Path: dirs[0], Pinned: true}); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("pin %d of %d slots: %v; want ErrInvalidParam", slots, slots, err)
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "one-too-many", Path: dirs[0]}); err != nil {
		t.Fatalf("the refused name unpinned: %v", err)
	}
	for _, st := range f.srv.ModelStatus() {
		if st.Parent != "" && st.Pinned != (st.ID != "one-too-many") {
			t.Errorf("model list: adapter %q pinned %v", st.ID, st.Pinned)
		}
	}
	// Pinning pre-warmed each, by the engine: resident before any
	// request, so the first request loads nothing.
	if st := f.sim.Stats(); st.AdapterLoads != int64(slots-1) || st.AdapterWarms != int64(slots-1) {
		t.Fatalf("%d adapter loads, %d warmed by the engine after pinning %d adapters; want each warmed once", st.AdapterLoads, st.AdapterWarms, slots-1)
	}
	r := req(4, 1, 2)
	r.Model = "pin0"
	if res, _ := collect(t, f.srv, r); len(res.Tokens) != 4 {
		t.Fatalf("a pinned adapter generated %v", res.Tokens)
	}
	if n := f.sim.Stats().AdapterLoads; n != int64(slots-1) {
		t.Fatalf("%d adapter loads after a request for a pinned adapter; want %d", n, slots-1)
	}
}

// A pinned adapter is warmed again when its base loads again, before any
// request of it: the request that loaded the base was the base's own.
func TestAdapterPinnedWarmAfterReload(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	if err := f.srv.RegisterModel(prewarm.Model{Spec: engine.ModelSpec{ID: "lazy"}}); err != nil {
		t.Fatal(err)
	}
	dirs := writeAdapters(t, 1)
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "tuned", Path: dirs[0], Base: "lazy", Pinned: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.UnloadModel(ctx, "lazy"); err != nil {
		t.Fatal(err)
	}
	r := req(2, 1, 2)
	r.Model = "lazy"
	collect(t, f.srv, r)
	if st := f.sim.Stats(); st.AdapterLoads != 2 || st.AdapterWarms != 2 {
		t.Fatalf("%d adapter loads, %d warmed by the engine after the base loaded again; want the pinned adapter warmed at each load (2)", st.AdapterLoads, st.AdapterWarms)
	}
	r.Model = "tuned"
	collect(t, f.srv, r)
	if n := f.sim.Stats().AdapterLoads; n != 2 {
		t.Fatalf("%d adapter loads after a request of the pinned adapter; want none more", n)
	}
}

// noAdapterWarmer is an engine whose models serve adapters but do not warm
// them (engine.AdapterWarmer): every optional interface but
// engine.AdapterModel is hidden.
type noAdapterWarmer struct{ engine.Engine }

func (e noAdapterWarmer) Load(ctx context.Context, spec engine.ModelSpec) (engine.Model, error) {
	m, err := e.Engine.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return struct {
		engine.Model
		engine.AdapterModel
	}{m, m.(engine.AdapterModel)}, nil
}

// A pinned adapter over an engine that does not warm adapters is warmed
// by one short generation: resident before its first request.
func TestAdapterPinnedWarmedByGeneration(t *testing.T) {
	sim, err := enginetest.NewSim(enginetest.WithContextLength(256), enginetest.WithVocabSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv, err := mlxserving.New(noAdapterWarmer{sim})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "sim"}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "pin", Path: writeAdapters(t, 1)[0], Pinned: true}); err != nil {
		t.Fatal(err)
	}
	if st := sim.Stats(); st.AdapterLoads != 1 || st.AdapterWarms != 0 || st.Steps == 0 {
		t.Fatalf("%d adapter loads, %d engine warm-ups, %d steps after pinning; want it warmed by a generation alone", st.AdapterLoads, st.AdapterWarms, st.Steps)
	}
	r := req(4, 1, 2)
	r.Model = "pin"
	collect(t, srv, r)
	if n := sim.Stats().AdapterLoads; n != 1 {
		t.Fatalf("%d adapter loads after a request of the warmed adapter; want 1", n)
	}
}

// An adapter outlives its base's eviction: the base loads again on the
// next request and the adapter is served over it as before.
func TestAdapterRestoredAfterReload(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	if err := f.srv.RegisterModel(prewarm.Model{Spec: engine.ModelSpec{ID: "lazy"}}); err != nil {
		t.Fatal(err)
	}
	dirs := writeAdapters(t, 1)
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "tuned", Path: dirs[0], Base: "lazy"}); err != nil {
		t.Fatal(err)
	}
	r := req(8, 7, 8, 9)
	r.Model = "tuned"
	before, _ := collect(t, f.srv, r)
	if err := f.srv.UnloadModel(ctx, "lazy"); err != nil {
		t.Fatal(err)
	}
	after, _ := collect(t, f.srv, r)
	if !slices.Equal(before.Tokens, after.Tokens) {
		t.Fatalf("adapter after its base reloaded: %v; before %v", after.Tokens, before.Tokens)
	}
	if st := f.sim.Stats(); st.AdapterLoads < 2 {
		t.Fatalf("adapter loads %d; the reloaded base should load it again", st.AdapterLoads)
	}
}

// A load balancer over two instances routes an adapter's requests to the
// instance that serves it, named as the model or as a parameter.
func TestAdapterRoutedToItsInstance(t *testing.T) {
	a, b := newFixture(t, nil), newFixture(t, nil)
	dirs := writeAdapters(t, 1)
	if _, err := b.srv.LoadAdapter(context.Background(), mlxserving.AdapterSpec{Name: "tuned", Path: dirs[0]}); err != nil {
		t.Fatal(err)
	}
	lb, err := balancer.New()
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	for name, f := range map[string]*fixture{"a": a, "b": b} {
		if err := lb.Add(name, f.srv); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		r := req(4, int32(i), 2, 3)
		r.Model = "tuned"
		if i%2 == 1 {
			r.Model, r.Adapter = "sim", "tuned"
		}
		st, err := lb.Generate(context.Background(), r)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if res, err := st.Collect(); err != nil || len(res.Tokens) != 4 {
			t.Fatalf("request %d: %v %v", i, res, err)
		}
	}
	if sa, sb := a.sim.Stats(), b.sim.Stats(); sa.Steps != 0 || sb.AdapterLoads == 0 {
		t.Fatalf("instance without the adapter ran %d steps; the one with it loaded it %d times", sa.Steps, sb.AdapterLoads)
	}
}

// The memory an engine's adapter slots take counts in the budget once a
// base serves adapters: once however many adapters it serves, and again
// at every later load of the base.
func TestAdapterSlotsCountInBudget(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithMemory(1000, 0), enginetest.WithAdapterMemory(300)},
		mlxserving.WithMemoryBudget(2700))
	ctx := context.Background()
	used := func(want int64, when string) {
		t.Helper()
		if got, _ := f.srv.Memory(); got != want {
			t.Fatalf("%s: %d bytes used, want %d", when, got, want)
		}
	}
	used(1000, "the base alone")
	dirs := writeAdapters(t, 3)
	for i, name := range []string{"a", "b"} {
		if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: name, Path: dirs[i]}); err != nil {
			t.Fatal(err)
		}
		used(1300, "adapters over the base")
	}
	if err := f.srv.RegisterModel(prewarm.Model{Spec: engine.ModelSpec{ID: "lazy"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.LoadAdapter(ctx, mlxserving.AdapterSpec{Name: "tuned", Path: dirs[2], Base: "lazy"}); err != nil {
		t.Fatal(err)
	}
	used(2600, "a second base with an adapter")
	if err := f.srv.UnloadModel(ctx, "lazy"); err != nil {
		t.Fatal(err)
	}
	used(1300, "the second base unloaded")
	r := req(4, 7, 8, 9)
	r.Model = "tuned"
	collect(t, f.srv, r) // loads lazy again, its adapter restored
	used(2600, "the second base loaded again")
}

// A base whose adapter slots do not fit the budget refuses the adapter
// with a BudgetError and keeps serving without it.
func TestAdapterSlotsOverBudget(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithMemory(1000, 0), enginetest.WithAdapterMemory(300)},
		mlxserving.WithMemoryBudget(1200))
	dirs := writeAdapters(t, 1)
	_, err := f.srv.LoadAdapter(context.Background(), mlxserving.AdapterSpec{Name: "a", Path: dirs[0]})
	var be *prewarm.BudgetError
	if !errors.As(err, &be) {
		t.Fatalf("LoadAdapter over a full budget: %v, want a *prewarm.BudgetError", err)
	}
	if got := f.srv.Adapters(); len(got) != 0 {
		t.Fatalf("adapters served after the refusal: %v", got)
	}
	if used, _ := f.srv.Memory(); used != 1000 {
		t.Fatalf("%d bytes used after the refusal, want 1000", used)
	}
	collect(t, f.srv, req(2, 1, 2, 3)) // the base still serves
}
