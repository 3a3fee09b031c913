//go:build mlx

package mlx

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// adapterLogits returns the logits after prompt for a sequence of adapter
// name (empty: the base), through the engine's forward.
func adapterLogits(t testing.TB, m *model, prompt []int32, name string) []float32 {
	t.Helper()
	var e *adapterEntry
	if name != "" {
		m.adapters.mu.Lock()
		e = m.adapters.reg[name]
		m.adapters.mu.Unlock()
	}
	var out []float32
	err := m.call(func(g *graph) error {
		s := &seqState{lora: e}
		if e != nil {
			slot, err := m.resident(g, e)
			if err != nil {
				return err
			}
			s.slot, s.inSlot = slot, true
			defer m.release(s)
		}
		defer s.free()
		lg := m.forward(g, []feed{{seq: s, tokens: prompt, sample: true}}, true)
		g.eval(lg)
		if g.err != nil {
			return g.err
		}
		var err error
		out, err = readFloat32s(lg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// unfuse splits the layers' q/k/v and gate/up products, which the loader
// fused, back into their parts (float weights) and lays the adapter slots
// out again, so that the forward pass takes its unfused paths. Before any
// adapter is opened.
func unfuse(t testing.TB, m *model) {
	t.Helper()
	c := m.cfg
	qd, kd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	err := m.call(func(g *graph) error {
		var made []arr
		split := func(f *linear, parts ...*linear) {
			in, at := shapeOf(f.w)[1], 0
			for _, p := range parts {
				out := shapeOf(*p.w0())[0]
				p.w = g.keep(g.slice(f.w, []int{at, 0}, []int{at + out, in}))
				p.wT = g.keep(g.transpose(p.w, 1, 0))
				made = append(made, p.w, p.wT)
				if !isNull(f.bias) {
					p.bias = g.keep(g.slice(f.bias, []int{at}, []int{at + out}))
					made = append(made, p.bias)
				}
				at += out
			}
			f.free()
			*f = linear{}
		}
		for li := range m.w.layers {
			l := &m.w.layers[li]
			q, k, v := linear{w: g.zeros(m.w.dtype, qd, 1)}, linear{w: g.zeros(m.w.dtype, kd, 1)}, linear{w: g.zeros(m.w.dtype, kd, 1)}
			split(&l.qkv, &q, &k, &v)
			l.q, l.k, l.v = q, k, v
			gate, up := linear{w: g.zeros(m.w.dtype, c.Intermediate, 1)}, linear{w: g.zeros(m.w.dtype, c.Intermediate, 1)}
			split(&l.gateUp, &gate, &up)
			l.gate, l.up = gate, up
		}
		g.eval(made...)
		m.adapters.stack = newLoRAStack(m, len(m.adapters.slots), g.k.cpu)
		return g.err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// w0 is the linear's weight as the split above sizes it.
func (l *linear) w0() *arr { return &l.w }

// TestAdapterUnfusedPaths: with q, k, v and gate, up as separate
// products (as when the loader cannot fuse them) the adapter's logits are
// the merged checkpoint's.
func TestAdapterUnfusedPaths(t *testing.T) {
	e := newEngine(t)
	for _, arch := range []string{"llama", "qwen2"} {
		c := writeAdapterCase(t, testmodel.TinyFamily(arch), testmodel.Adapter{Rank: 4, Seed: 21})
		m := loadSpec(t, e, engine.ModelSpec{Path: c.base})
		ref := loadSpec(t, e, engine.ModelSpec{Path: c.merged, ID: "merged"})
		unfuse(t, m)
		if !isNull(m.w.layers[0].qkv.w) || isNull(m.w.layers[0].q.w) || m.adapters.stack.layers[0][pQ] == nil {
			t.Fatal("the layers are still fused")
		}
		addAdapter(t, m, "a", c.adapter)
		for i, p := range prompts() {
			got, want := adapterLogits(t, m, p, "a"), adapterLogits(t, ref, p, "")
			base := adapterLogits(t, m, p, "")
			d, scale := maxDiff(got, want)
			effect, _ := maxDiff(base, want)
			if d > 1e-4*max(scale, 1) || effect < 100*d {
				t.Errorf("%s prompt %d: adapter logits differ from merged by %g (scale %g); the adapter moves them by %g", arch, i, d, scale, effect)
			}
		}
	}
}

// TestAdapterLowPrecision: over a bfloat16 model and an 8-bit quantized
// one, the adapter's logits are the merged checkpoint's within the
// precision's error, far closer than the base's.
func TestAdapterLowPrecision(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.Tiny()
	a := testmodel.Adapter{Rank: 8, Seed: 22}
	c := writeAdapterCase(t, cfg, a)
	bf := cfg
	bf.DType = "bfloat16"
	cb := writeAdapterCase(t, bf, a)
	q8 := filepath.Join(t.TempDir(), "q8")
	if err := e.Quantize(context.Background(), c.base, q8, 8, 64); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, base, merged string }{{"bfloat16", cb.base, cb.merged}, {"q8", q8, c.merged}} {
		m := loadSpec(t, e, engine.ModelSpec{Path: tc.base})
		ref := loadSpec(t, e, engine.ModelSpec{Path: tc.merged, ID: "merged"})
		addAdapter(t, m, "a", c.adapter)
		for i, p := range prompts() {
			want := adapterLogits(t, ref, p, "")
			d, _ := maxDiff(adapterLogits(t, m, p, "a"), want)
			effect, _ := maxDiff(adapterLogits(t, m, p, ""), want)
			if d > effect/10 {
				t.Errorf("%s prompt %d: adapter logits differ from merged by %g, the base's by %g", tc.name, i, d, effect)
			}
		}
	}
}

// TestAdapterPrimitives: a step of base sequences builds the primitives
// it builds on a model serving no adapter, even with adapters resident
// (the LoRA path is skipped whole); steps with adapted tokens add the
// gathered products.
func TestAdapterPrimitives(t *testing.T) {
	e := newEngine(t)
	c := writeAdapterCase(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 23})
	m := loadSpec(t, e, engine.ModelSpec{Path: c.base})
	plain := loadSpec(t, e, engine.ModelSpec{Path: c.base, ID: "plain"})
	addAdapter(t, m, "x", c.adapter)
	p := prompts()[0]
	generateAdapter(t, m, 1, p, 3, len(p), "x") // resident
	generateAdapter(t, plain, 1, p, 3, len(p), "")
	want := plain.Primitives()
	generateAdapter(t, m, 2, p, 3, len(p), "")
	if got := m.Primitives(); got != want {
		t.Errorf("base decode step with an adapter resident: %+v primitives, %+v without adapters", got, want)
	}
	generateAdapter(t, m, 3, p, 3, len(p), "x")
	adapted := m.Primitives()
	ctx := context.Background()
	for i, a := range []string{"", "x"} {
		id := engine.SeqID(10 + i)
		if _, err := m.OpenAdapter(ctx, id, p, "", a); err != nil {
			t.Fatal(err)
		}
		defer m.Free(id, "")
		if _, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: p, Sample: true}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 10, Tokens: p[:1], Sample: true}, {Seq: 11, Tokens: p[:1], Sample: true}}); err != nil {
		t.Fatal(err)
	}
	mixed := m.Primitives()
	t.Logf("decode step primitives per layer: base %.0f, all adapted %.0f, half adapted %.0f", want.PerLayer(), adapted.PerLayer(), mixed.PerLayer())
	if adapted.Layers <= want.Layers || mixed.Layers <= adapted.Layers {
		t.Errorf("layer primitives: base %d, adapted %d, mixed %d; want them increasing", want.Layers, adapted.Layers, mixed.Layers)
	}
}
