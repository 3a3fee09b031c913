package lora

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

func write(t *testing.T, base testmodel.Config, a testmodel.Adapter) (model, adapter string) {
	t.Helper()
	model, adapter = t.TempDir(), t.TempDir()
	if err := testmodel.Write(model, base); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteAdapter(adapter, base, a); err != nil {
		t.Fatal(err)
	}
	return model, adapter
}

// The same adapter written in PEFT's and mlx-lm's layouts reads to the
// same pairs, scale and weights, and fits its model.
func TestReadBothLayouts(t *testing.T) {
	base := testmodel.Tiny()
	model, peft := write(t, base, testmodel.Adapter{Rank: 4, Alpha: 16, Seed: 3})
	mlxDir := t.TempDir()
	if err := testmodel.WriteAdapter(mlxDir, base, testmodel.Adapter{Rank: 4, Alpha: 16, Seed: 3, MLX: true}); err != nil {
		t.Fatal(err)
	}
	b, err := ReadBase(model)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Read(peft)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Read(mlxDir)
	if err != nil {
		t.Fatal(err)
	}
	if p.Format != FormatPEFT || m.Format != FormatMLX {
		t.Fatalf("formats %q %q", p.Format, m.Format)
	}
	if p.Rank != 4 || p.Scale != 4 || m.Scale != 4 {
		t.Fatalf("rank %d, scales %v %v; want 4, 4, 4", p.Rank, p.Scale, m.Scale)
	}
	if len(p.Pairs) != 2*7 || len(m.Pairs) != len(p.Pairs) {
		t.Fatalf("pairs: %d and %d, want 14", len(p.Pairs), len(m.Pairs))
	}
	if got := strings.Join(p.Targets(), ","); got != "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj" {
		t.Fatalf("targets %s", got)
	}
	for _, a := range []*Adapter{p, m} {
		if err := a.Check(b, 64); err != nil {
			t.Fatalf("%s: %v", a.Format, err)
		}
	}
	for i := range p.Pairs {
		pa, pb, err := p.Load(p.Pairs[i])
		if err != nil {
			t.Fatal(err)
		}
		ma, mb, err := m.Load(m.Pairs[i])
		if err != nil {
			t.Fatal(err)
		}
		if p.Pairs[i].Module != m.Pairs[i].Module || len(pa) != 4*p.Pairs[i].In || len(pb) != 4*p.Pairs[i].Out {
			t.Fatalf("pair %d: %+v vs %+v", i, p.Pairs[i], m.Pairs[i])
		}
		for j := range pa {
			if pa[j] != ma[j] {
				t.Fatalf("pair %d A[%d]: %v vs %v", i, j, pa[j], ma[j])
			}
		}
		for j := range pb {
			if pb[j] != mb[j] {
				t.Fatalf("pair %d B[%d]: %v vs %v", i, j, pb[j], mb[j])
			}
		}
	}
	// q (64→64), k and v (64→32), o (64→64), gate and up (64→128), down
	// (128→64) over 2 layers, r·(in+out) values each, 2 bytes a value.
	if got, want := p.Bytes(2), int64(2*2*4*(128+96+96+128+192+192+192)); got != want {
		t.Fatalf("bytes %d, want %d", got, want)
	}
}

func TestRSLoRAScale(t *testing.T) {
	_, dir := write(t, testmodel.Tiny(), testmodel.Adapter{Rank: 16, Alpha: 8, RSLoRA: true})
	a, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.Scale != 2 {
		t.Fatalf("rsLoRA scale %v, want 8/sqrt(16) = 2", a.Scale)
	}
}

func editJSON(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	raw, _ = json.Marshal(m)
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Adapters the engines cannot serve, or that do not fit the model, are
// refused with a CheckpointError that says why.
func TestRefused(t *testing.T) {
	base := testmodel.Tiny()
	model, _ := write(t, base, testmodel.Adapter{})
	b, err := ReadBase(model)
	if err != nil {
		t.Fatal(err)
	}
	other := base
	other.Hidden, other.Intermediate = 128, 256
	cases := []struct {
		name string
		make func(dir string)
		want string
	}{
		{"dora", func(d string) {
			editJSON(t, filepath.Join(d, "adapter_config.json"), func(m map[string]any) { m["use_dora"] = true })
		}, "DoRA"},
		{"loha", func(d string) {
			editJSON(t, filepath.Join(d, "adapter_config.json"), func(m map[string]any) { m["peft_type"] = "LOHA" })
		}, "only LORA"},
		{"rank mismatch", func(d string) {
			editJSON(t, filepath.Join(d, "adapter_config.json"), func(m map[string]any) { m["r"] = 4 })
		}, "rank 8"},
		{"modules to save", func(d string) {
			editJSON(t, filepath.Join(d, "adapter_config.json"), func(m map[string]any) { m["modules_to_save"] = []string{"lm_head"} })
		}, "modules_to_save"},
		{"no weights file", func(d string) { os.Remove(filepath.Join(d, "adapter_model.safetensors")) }, "missing"},
		{"no config", func(d string) { os.Remove(filepath.Join(d, "adapter_config.json")) }, "missing"},
		{"garbage config", func(d string) { os.WriteFile(filepath.Join(d, "adapter_config.json"), []byte("{nope"), 0o644) }, "JSON"},
		{"truncated weights", func(d string) {
			p := filepath.Join(d, "adapter_model.safetensors")
			raw, _ := os.ReadFile(p)
			os.WriteFile(p, raw[:len(raw)/2], 0o644)
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.WriteAdapter(dir, base, testmodel.Adapter{}); err != nil {
				t.Fatal(err)
			}
			c.make(dir)
			_, err := Read(dir)
			var ce *engine.CheckpointError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Read: %v; want a CheckpointError saying %q", err, c.want)
			}
		})
	}
	check := []struct {
		name    string
		cfg     testmodel.Config
		a       testmodel.Adapter
		maxRank int
		want    string
	}{
		{"wider model", other, testmodel.Adapter{}, 64, "is 256→128 in the adapter, 128→64 in the model"},
		{"rank above max", base, testmodel.Adapter{Rank: 32}, 16, "rank 32 is above"},
		{"too many layers", func() testmodel.Config { c := base; c.Layers = 4; return c }(), testmodel.Adapter{Layers: []int{3}}, 64, "layer 3: the model has 2"},
	}
	for _, c := range check {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.WriteAdapter(dir, c.cfg, c.a); err != nil {
				t.Fatal(err)
			}
			a, err := Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			err = a.Check(b, c.maxRank)
			var ce *engine.CheckpointError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Check: %v; want a CheckpointError saying %q", err, c.want)
			}
		})
	}
}

// A NaN weight is refused by CheckFinite and Load.
func TestNaNRefused(t *testing.T) {
	_, dir := write(t, testmodel.Tiny(), testmodel.Adapter{})
	p := filepath.Join(dir, "adapter_model.safetensors")
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	binary.LittleEndian.PutUint32(raw[8+n+4*5:], math.Float32bits(float32(math.NaN())))
	if err := os.WriteFile(p, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = a.CheckFinite()
	if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), "finite") {
		t.Fatalf("CheckFinite: %v", err)
	}
}

// A mixture of experts adapts attention and its dense layers only; an
// encoder adapts nothing.
func TestBases(t *testing.T) {
	moe := testmodel.TinyFamily("qwen3_moe")
	moe.DenseLayers = []int{0}
	model, dir := write(t, moe, testmodel.Adapter{})
	b, err := ReadBase(model)
	if err != nil {
		t.Fatal(err)
	}
	if b.Dense == nil || !b.Dense[0] || b.Dense[1] {
		t.Fatalf("dense layers %v, want 0 only", b.Dense)
	}
	a, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check(b, 64); err != nil {
		t.Fatalf("attention adapter on qwen3_moe: %v", err)
	}
	mlpDir := t.TempDir()
	if err := testmodel.WriteAdapter(mlpDir, moe, testmodel.Adapter{Targets: []string{"mlp.down_proj"}}); err != nil {
		t.Fatal(err)
	}
	if a, err = Read(mlpDir); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(b, 64); err == nil || !strings.Contains(err.Error(), "mixture of experts") {
		t.Fatalf("expert MLP adapter: %v", err)
	}
	phi := testmodel.TinyFamily("phi3")
	model, dir = write(t, phi, testmodel.Adapter{})
	if b, err = ReadBase(model); err != nil {
		t.Fatal(err)
	}
	if a, err = Read(dir); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(b, 64); err != nil {
		t.Fatalf("phi3 fused: %v", err)
	}
	enc := t.TempDir()
	if err := testmodel.Write(enc, testmodel.Config{Arch: "bert", Heads: 4, KVHeads: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBase(enc); !errors.Is(err, engine.ErrBadCheckpoint) {
		t.Fatalf("bert base: %v", err)
	}
}
