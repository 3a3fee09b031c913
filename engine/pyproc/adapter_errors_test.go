package pyproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestAdapterErrors: adapters that do not fit the model are refused with
// a *engine.CheckpointError and the model keeps serving; a removed
// adapter is not found.
func TestAdapterErrors(t *testing.T) {
	e := newEngine(t)
	c := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 41})
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base, MaxAdapterRank: 16})
	want := generate(t, m, 1, prompt(1, 9), 6)
	dir := t.TempDir()
	write := func(name string, base testmodel.Config, ad testmodel.Adapter) string {
		t.Helper()
		d := filepath.Join(dir, name)
		if err := testmodel.WriteAdapter(d, base, ad); err != nil {
			t.Fatal(err)
		}
		return d
	}
	wider := testmodel.Tiny()
	wider.Intermediate = 96
	shapes := write("shapes", wider, testmodel.Adapter{Rank: 8})
	rank := write("rank", testmodel.Tiny(), testmodel.Adapter{Rank: 32})
	nan := write("nan", testmodel.Tiny(), testmodel.Adapter{Rank: 8})
	patch(t, filepath.Join(nan, "adapter_model.safetensors"), func(b []byte, data int) {
		copy(b[data+4*5:], []byte{0x00, 0x00, 0xc0, 0x7f}) // the sixth float32 of the first tensor: NaN
	})
	module := write("module", testmodel.Tiny(), testmodel.Adapter{Rank: 8, Targets: []string{"self_attn.q_proj"}})
	patch(t, filepath.Join(module, "adapter_model.safetensors"), func(b []byte, data int) {
		replaceAll(b[:data], "q_proj", "x_proj")
	})
	bert := filepath.Join(dir, "bert")
	if err := testmodel.Write(bert, testmodel.TinyFamily("bert")); err != nil {
		t.Fatal(err)
	}
	enc := loadSpec(t, e, engine.ModelSpec{ID: "bert", Path: bert})
	for _, tc := range []struct {
		name string
		m    *Model
		dir  string
	}{
		{"shapes", m, shapes}, {"rank", m, rank}, {"nan", m, nan}, {"module", m, module},
		{"missing", m, filepath.Join(dir, "none")}, {"encoder base", enc, c.adapter},
	} {
		_, err := tc.m.AddAdapter(context.Background(), engine.AdapterSpec{Name: tc.name, Path: tc.dir})
		var ce *engine.CheckpointError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a *engine.CheckpointError", tc.name, err)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	if len(m.Adapters()) != 0 {
		t.Fatalf("refused adapters are served: %+v", m.Adapters())
	}
	var ipe *engine.InvalidParamError
	if _, err := m.AddAdapter(context.Background(), engine.AdapterSpec{Path: c.adapter}); !errors.As(err, &ipe) {
		t.Errorf("no name: %v", err)
	}
	if got := generate(t, m, 2, prompt(1, 9), 6); !slices.Equal(got, want) {
		t.Fatalf("after refused adapters: %v, want %v", got, want)
	}
	addAdapter(t, m, "ok", c.adapter)
	if names := m.Adapters(); len(names) != 1 || names[0].Name != "ok" || names[0].Path != c.adapter {
		t.Fatalf("adapters %+v", names)
	}
	if err := m.RemoveAdapter("ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OpenAdapter(context.Background(), 3, prompt(1, 9), "", "ok"); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("open with a removed adapter: %v", err)
	}
	if err := m.RemoveAdapter("ok"); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("removing it again: %v", err)
	}
}

// patch rewrites a safetensors file in place; f gets its bytes and where
// the data starts.
func patch(t *testing.T, path string, f func(b []byte, data int)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := 7; i >= 0; i-- {
		n = n<<8 | int(b[i])
	}
	f(b, 8+n)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func replaceAll(b []byte, old, new string) {
	for i := 0; i+len(old) <= len(b); i++ {
		if string(b[i:i+len(old)]) == old {
			copy(b[i:], new)
		}
	}
}

// TestAdapterWorkerLost kills the worker while adapter sequences step:
// the step fails as lost, and the adapter, reloaded on demand on the
// replacement worker, decodes its tokens again.
func TestAdapterWorkerLost(t *testing.T) {
	e := newEngine(t, withFaults())
	c := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 51})
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base})
	addAdapter(t, m, "x", c.adapter)
	p := prompt(2, 11)
	want := generateWith(t, m, 1, p, 8, "x")
	ctx := context.Background()
	for _, seq := range []engine.SeqID{2, 3} {
		if _, err := m.OpenAdapter(ctx, seq, p, "", "x"); err != nil {
			t.Fatal(err)
		}
	}
	batch := []engine.StepInput{{Seq: 2, Tokens: p, Sample: true, Params: greedy}, {Seq: 3, Tokens: p, Sample: true, Params: greedy}}
	if _, err := m.Step(ctx, batch); err != nil {
		t.Fatal(err)
	}
	old := inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 2})
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = syscall.Kill(old.pid(), syscall.SIGKILL)
	}()
	batch = []engine.StepInput{{Seq: 2, Tokens: want[:1], Sample: true, Params: greedy}, {Seq: 3, Tokens: want[:1], Sample: true, Params: greedy}}
	if _, err := m.Step(ctx, batch); !errors.Is(err, engine.ErrWorkerLost) {
		t.Fatalf("step on the killed worker: %v", err)
	}
	m.Free(2, "")
	m.Free(3, "")
	if got := generateWith(t, m, 4, p, 8, "x"); !slices.Equal(got, want) {
		t.Fatalf("on the replacement worker: %v, want %v", got, want)
	}
	if w := e.Workers()[0]; w.Restarts != 1 {
		t.Fatalf("workers %+v", w)
	}
}

// TestAdapterChangedToNaN: an adapter whose file changes after it was
// added (and checked) is refused by the worker when its first sequence
// loads it, with a *engine.CheckpointError, and the slot it was read into
// is left holding nothing: in steps whose delta spans every slot
// (Tuning.DenseLoRA, as the CUDA graphs compute it, where a NaN in any
// slot would reach every row) another adapter and the base keep their
// tokens. Two changes: a NaN in the last tensor (read last, so every
// other pair is written first), and a NaN in the first B read followed by
// a tensor gone missing (the load stops on the missing one).
func TestAdapterChangedToNaN(t *testing.T) {
	e := newEngine(t, WithTuning(Tuning{DenseLoRA: true}))
	cx := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 11})
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: cx.base})
	addAdapter(t, m, "x", cx.adapter)
	prompts := [][]int32{prompt(1, 19), prompt(3, 33)}
	adapters := []string{"x", ""}
	want := stepAdapters(t, m, prompts, adapters, 6)
	const lastB = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
	const firstB = "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"
	nan := []byte{0x00, 0x00, 0xc0, 0x7f} // float32 NaN
	for i, change := range []func(b []byte, data int){
		func(b []byte, data int) { copy(b[tensorAt(t, b, data, lastB):], nan) },
		func(b []byte, data int) {
			copy(b[tensorAt(t, b, data, firstB):], nan)
			replaceAll(b[:data], "layers.1.self_attn.v_proj.lora_A", "layers.1.self_attn.v_proj.lora_X")
		},
	} {
		name := fmt.Sprintf("bad%d", i)
		dir := filepath.Join(t.TempDir(), name)
		if err := testmodel.WriteAdapter(dir, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: int64(12 + i)}); err != nil {
			t.Fatal(err)
		}
		addAdapter(t, m, name, dir)
		patch(t, filepath.Join(dir, "adapter_model.safetensors"), change)
		seq := engine.SeqID(50 + i)
		_, err := m.OpenAdapter(context.Background(), seq, prompt(2, 9), "", name)
		var ce *engine.CheckpointError
		if !errors.As(err, &ce) {
			m.Free(seq, "")
			t.Fatalf("%s: opening with an adapter whose file changed: %v, want a *engine.CheckpointError", name, err)
		}
		t.Logf("%s refused: %v", name, err)
		if got := stepAdapters(t, m, prompts, adapters, 6); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("after %s's refused load: %v, want %v", name, got, want)
		}
	}
}

// tensorAt is the offset in a safetensors file's bytes b (data: where
// its data starts) of the named tensor's first value.
func tensorAt(t *testing.T, b []byte, data int, name string) int {
	t.Helper()
	var header map[string]json.RawMessage
	if err := json.Unmarshal(b[8:data], &header); err != nil {
		t.Fatal(err)
	}
	var e struct {
		Offsets [2]int `json:"data_offsets"`
	}
	if err := json.Unmarshal(header[name], &e); err != nil {
		t.Fatalf("tensor %s: %v", name, err)
	}
	return data + e.Offsets[0]
}
