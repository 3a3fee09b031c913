//go:build mlx

package mlx

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// dequantized returns a copy of m whose quantized layers are replaced by
// their dequantized float weights: the same numbers through the float path.
func dequantized(t *testing.T, m *model) *model {
	t.Helper()
	w := *m.w
	d := &model{eng: m.eng, cfg: m.cfg, info: m.info, w: &w, pool: m.pool}
	var made []arr
	t.Cleanup(func() {
		m.call(func(*graph) error {
			for i := range made {
				free(&made[i])
			}
			return nil
		})
	})
	err := m.call(func(g *graph) error {
		deq := func(l *linear) {
			if l.q == nil {
				return
			}
			f := g.dequantize(l.w, l.scales, l.biases, l.q.GroupSize, l.q.Bits)
			var tr arr
			if len(shapeOf(l.w)) == 3 { // stacked experts
				tr = g.transpose(f, 0, 2, 1)
			} else {
				tr = g.transpose(f, 1, 0)
			}
			*l = linear{w: g.keep(f), wT: g.keep(tr), bias: l.bias}
			made = append(made, l.w, l.wT)
		}
		deq(&w.embed)
		deq(&w.head)
		w.layers = slices.Clone(m.w.layers)
		for i := range w.layers {
			l := &w.layers[i]
			if l.moe != nil {
				e := *l.moe
				l.moe = &e
			}
			for _, lin := range l.linears() {
				deq(lin)
			}
		}
		g.eval(w.all()...)
		return g.err
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestQuantizedMatchesDequantized(t *testing.T) {
	e := newEngine(t)
	src := tinyDir(t, nil)
	f32 := load(t, e, src)
	p := prompts()[2]
	ref := lastLogits(t, f32, p)
	for _, bits := range []int{4, 8} {
		dst := t.TempDir()
		if err := e.Quantize(context.Background(), src, dst, bits, 32); err != nil {
			t.Fatal(err)
		}
		q := load(t, e, dst)
		if q.w.layers[0].qkv.q == nil || q.w.embed.q == nil || q.w.layers[0].qkv.q.Bits != bits {
			t.Fatalf("%d-bit checkpoint loaded unquantized", bits)
		}
		got := lastLogits(t, q, p)
		want := lastLogits(t, dequantized(t, q), p)
		diff, scale := maxDiff(got, want)
		t.Logf("%d-bit: max |quantized - dequantized f32| = %.2e (logit scale %.2f); vs original f32: %.3f", bits, diff, scale, first(maxDiff(got, ref)))
		if diff > 1e-3*scale {
			t.Errorf("%d-bit: quantized and dequantized logits differ by %v (scale %v), tolerance 1e-3 of scale", bits, diff, scale)
		}
		if d, _ := maxDiff(got, ref); bits == 8 && d > 0.05*scale {
			t.Errorf("8-bit logits differ from float32 by %v (scale %v)", d, scale)
		}
	}
}

func first(a, _ float64) float64 { return a }

// TestQuantizedExperts quantizes the mixture-of-experts families: their
// stacked experts run through gather_qmm, and must give what gather_mm
// gives over the dequantized weights, for a prompt long enough that the
// tokens are sorted by expert (sortAt) and for one-token decode.
func TestQuantizedExperts(t *testing.T) {
	e := newEngine(t)
	long := make([]int32, 50)
	for i := range long {
		long[i] = int32(1 + i*7%300)
	}
	for _, arch := range []string{"qwen3_moe", "mixtral"} {
		src := t.TempDir()
		if err := testmodel.Write(src, testmodel.TinyFamily(arch)); err != nil {
			t.Fatal(err)
		}
		dst := t.TempDir()
		if err := e.Quantize(context.Background(), src, dst, 8, 32); err != nil {
			t.Fatal(err)
		}
		q := load(t, e, dst)
		if l := q.w.layers[0]; l.moe == nil || l.moe.gate.q == nil {
			t.Fatalf("%s: experts loaded unquantized", arch)
		}
		for _, p := range [][]int32{long, {1, 42}} {
			got := lastLogits(t, q, p)
			want := lastLogits(t, dequantized(t, q), p)
			diff, scale := maxDiff(got, want)
			if diff > 1e-3*scale {
				t.Errorf("%s, %d tokens: gather_qmm and gather_mm logits differ by %v (scale %v)", arch, len(p), diff, scale)
			}
		}
		f32 := lastLogits(t, load(t, e, src), long)
		if d, scale := maxDiff(lastLogits(t, q, long), f32); d > 0.05*scale {
			t.Errorf("%s: 8-bit logits differ from float32 by %v (scale %v)", arch, d, scale)
		}
	}
}

func TestHalfPrecisionAndTied(t *testing.T) {
	e := newEngine(t)
	ref := lastLogits(t, load(t, e, tinyDir(t, nil)), prompts()[0])
	for _, dt := range []string{"float16", "bfloat16"} {
		m := load(t, e, tinyDir(t, func(c *testmodel.Config) { c.DType = dt }))
		got := lastLogits(t, m, prompts()[0])
		diff, scale := maxDiff(got, ref)
		t.Logf("%s: max logit difference from float32 %.3f (scale %.2f)", dt, diff, scale)
		if diff > 0.05*scale {
			t.Errorf("%s logits differ from float32 by %v (scale %v)", dt, diff, scale)
		}
	}
	for _, arch := range []string{"mistral", "qwen2"} {
		m := load(t, e, tinyDir(t, func(c *testmodel.Config) { c.Arch = arch; c.TieEmbeddings = true }))
		toks := generateBatch(t, m, prompts(), 4, nil)
		if len(toks[0]) != 4 {
			t.Fatalf("%s: %v", arch, toks)
		}
	}
}

// TestShardedIndex splits a checkpoint into two shards with an index file;
// the model must load the same.
func TestShardedIndex(t *testing.T) {
	e := newEngine(t)
	dir := tinyDir(t, nil)
	want := lastLogits(t, load(t, e, dir), prompts()[1])
	shard(t, dir)
	got := lastLogits(t, load(t, e, dir), prompts()[1])
	if d, _ := maxDiff(got, want); d != 0 {
		t.Fatalf("sharded logits differ by %v", d)
	}
}

func shard(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	data := b[8+n:]
	var names []string
	for k := range hdr {
		if k != "__metadata__" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	index := map[string]string{}
	for part, group := range [][]string{names[:len(names)/2], names[len(names)/2:]} {
		file := []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}[part]
		h := map[string]any{}
		var body []byte
		for _, k := range group {
			var ent struct {
				DType   string  `json:"dtype"`
				Shape   []int   `json:"shape"`
				Offsets []int64 `json:"data_offsets"`
			}
			json.Unmarshal(hdr[k], &ent)
			start := int64(len(body))
			body = append(body, data[ent.Offsets[0]:ent.Offsets[1]]...)
			h[k] = map[string]any{"dtype": ent.DType, "shape": ent.Shape, "data_offsets": []int64{start, int64(len(body))}}
			index[k] = file
		}
		hb, _ := json.Marshal(h)
		out := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
		out = append(append(out, hb...), body...)
		if err := os.WriteFile(filepath.Join(dir, file), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(path)
	ib, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": index})
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), ib, 0o644); err != nil {
		t.Fatal(err)
	}
}
