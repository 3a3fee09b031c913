package mlx

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

func writeTiny(t *testing.T, cfg testmodel.Config) string {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	return dir
}

func editConfig(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// plan runs the whole pure-Go check a load does before touching MLX.
func plan(dir string) (*modelConfig, []module, error) {
	c, err := readConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	man, _, err := manifest(dir)
	if err != nil {
		return nil, nil, err
	}
	mods, err := planModules(c, man)
	return c, mods, err
}

func TestPlanTinyArchitectures(t *testing.T) {
	for _, arch := range []string{"llama", "mistral", "qwen2"} {
		cfg := testmodel.Tiny()
		cfg.Arch = arch
		cfg.TieEmbeddings = arch == "mistral"
		c, mods, err := plan(writeTiny(t, cfg))
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if c.Arch != arch || c.Layers != 2 || c.Hidden != 64 || c.KVHeads != 2 || c.HeadDim != 16 || c.QKVBias != (arch == "qwen2") || c.Tied != cfg.TieEmbeddings {
			t.Errorf("%s: config %+v", arch, c)
		}
		want := 2 + 9*2
		if !c.Tied {
			want++
		}
		if len(mods) != want {
			t.Errorf("%s: %d modules, want %d", arch, len(mods), want)
		}
	}
}

func TestGenerationEOS(t *testing.T) {
	dir := writeTiny(t, testmodel.Tiny())
	c, err := readConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.EOS) == 0 {
		t.Fatal("no EOS read")
	}
	want := append(slices.Clone(c.EOS), 7, 9)
	os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": [7, 9]}`), 0o644)
	if c, err = readConfig(dir); err != nil || !slices.Equal(c.EOS, want) {
		t.Fatalf("EOS %v, %v; want %v", c.EOS, err, want)
	}
}

func TestRopeScalingLlama3(t *testing.T) {
	cfg := testmodel.Tiny()
	cfg.RopeScaling = &testmodel.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	c, _, err := plan(writeTiny(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	f := ropeFreqs(c)
	if len(f) != c.HeadDim/2 {
		t.Fatalf("%d frequencies, want %d", len(f), c.HeadDim/2)
	}
	// The highest frequency is untouched; the lowest is scaled by factor.
	if f[0] != 1 {
		t.Errorf("f[0] = %v, want 1", f[0])
	}
	if last := f[len(f)-1]; last < 8*1000 {
		t.Errorf("lowest frequency %v not scaled by 8", last)
	}
}

// stFile is a safetensors file with the given header and 64 data bytes.
func stFile(header string) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), make([]byte, 64)...)
}

func TestBadCheckpoints(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   string
	}{
		{"missing config", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "config.json")) }, "config.json is missing"},
		{"missing weights", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "model.safetensors")) }, "no *.safetensors"},
		{"unsupported arch", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["model_type"] = "gpt2" })
		}, "unsupported architecture"},
		{"unsupported quant mode", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) {
				m["quantization"] = map[string]any{"group_size": 64, "bits": 4, "mode": "mxfp4"}
			})
		}, "unsupported quantization mode"},
		{"unsupported quant bits", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["quantization"] = map[string]any{"group_size": 64, "bits": 5} })
		}, "unsupported quantization bits"},
		{"shape contradicts config", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["intermediate_size"] = 96 })
		}, "contradicts config.json"},
		{"truncated", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors")
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-100)
		}, "truncated"},
		{"garbage header", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "model.safetensors"), []byte("\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"), 0o644)
		}, "corrupt safetensors"},
		{"empty file", func(t *testing.T, dir string) { os.WriteFile(filepath.Join(dir, "model.safetensors"), nil, 0o644) }, "too short"},
		{"bad index", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(`{"weight_map":{}}`), 0o644)
		}, "invalid index"},
		{"10 GB declared tensor", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "model.safetensors"), stFile(`{"model.embed_tokens.weight":{"dtype":"F32","shape":[50000,50000],"data_offsets":[0,10000000000]}}`), 0o644)
		}, "outside"},
		{"unknown dtype", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "model.safetensors"), stFile(`{"model.norm.weight":{"dtype":"Q4","shape":[4],"data_offsets":[0,4]}}`), 0o644)
		}, "unknown dtype"},
		{"huge config sizes", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["max_position_embeddings"] = 1 << 40 })
		}, "beyond any supported model"},
		{"huge config.json", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "config.json"), make([]byte, 5<<20), 0o644)
		}, "larger than"},
		{"shard outside", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(`{"weight_map":{"a":"../x.safetensors"}}`), 0o644)
		}, "outside the checkpoint"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTiny(t, testmodel.Tiny())
			tc.break_(t, dir)
			_, _, err := plan(dir)
			var ce *engine.CheckpointError
			if !errors.As(err, &ce) || !errors.Is(err, engine.ErrBadCheckpoint) {
				t.Fatalf("err = %v, want a *engine.CheckpointError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestQuantConfig(t *testing.T) {
	q, reason := parseQuant(map[string]any{
		"group_size": 64.0, "bits": 4.0,
		"lm_head":            map[string]any{"group_size": 32.0, "bits": 8.0},
		"model.embed_tokens": false,
	})
	if reason != "" {
		t.Fatal(reason)
	}
	if p, ok := q.params("model.layers.0.mlp.up_proj"); !ok || p != (quantParams{GroupSize: 64, Bits: 4}) {
		t.Errorf("default params = %v, %v", p, ok)
	}
	if p, ok := q.params("lm_head"); !ok || p != (quantParams{GroupSize: 32, Bits: 8}) {
		t.Errorf("override = %v, %v", p, ok)
	}
	if _, ok := q.params("model.embed_tokens"); ok {
		t.Error("skipped module reported quantized")
	}
}

func TestOptionsRejectBadValues(t *testing.T) {
	for _, opt := range []Option{WithMaxBatch(0), WithPrefixSlots(-1), WithDevice("tpu"), WithMemoryLimit(0), WithKVFraction(0), WithLogger(nil)} {
		o := defaultOptions()
		if err := o.apply([]Option{opt}); err == nil {
			t.Errorf("option accepted")
		}
	}
	o := defaultOptions()
	if err := o.apply([]Option{nil, WithMaxBatch(8)}); err != nil || o.maxBatch != 8 {
		t.Errorf("a nil option is skipped: %v, max batch %d", err, o.maxBatch)
	}
}

// TestPlanFamilies reads every family testmodel writes into its model
// description.
func TestPlanFamilies(t *testing.T) {
	for _, arch := range testmodel.Archs() {
		c, _, err := plan(writeTiny(t, testmodel.TinyFamily(arch)))
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		var want []bool
		switch arch {
		case "mistral", "mixtral":
			want = []bool{true, true}
		case "gemma2":
			want = []bool{true, false}
		case "gemma3", "gemma3_text", "gpt_oss":
			want = []bool{true, false, true, false}
		}
		if !slices.Equal(c.Sliding, want) || (want != nil && c.Window != 16) {
			t.Errorf("%s: sliding layers %v of window %d, want %v of 16", arch, c.Sliding, c.Window, want)
		}
		if (c.MoE != nil) != (arch == "qwen3_moe" || arch == "mixtral" || arch == "gpt_oss") {
			t.Errorf("%s: experts %+v", arch, c.MoE)
		}
	}
	c, _, _ := plan(writeTiny(t, testmodel.TinyFamily("qwen3_moe")))
	if !slices.Equal(c.MoE.Sparse, []bool{true, false, true}) || !c.MoE.NormTopK || c.MoE.Inter != 64 {
		t.Errorf("qwen3_moe: %+v", c.MoE)
	}
	c, _, _ = plan(writeTiny(t, testmodel.TinyFamily("phi3")))
	if c.RotaryDim != 8 || c.Rope.Type != "longrope" || c.Rope.OriginalMax != 128 || c.Rope.AttnFactor <= 1 {
		t.Errorf("phi3: rotary %d, rope %+v", c.RotaryDim, c.Rope)
	}
	c, _, _ = plan(writeTiny(t, testmodel.TinyFamily("gpt_oss")))
	if m := c.MoE; !m.Stacked || !m.SoftmaxTopK || m.Limit != 1.5 || !c.Sinks || !c.OBias || !c.QKVBias || c.Rope.Type != "yarn" || c.Rope.Truncate {
		t.Errorf("gpt_oss: %+v, experts %+v", c, m)
	}
	c, _, _ = plan(writeTiny(t, testmodel.TinyFamily("gemma3")))
	if c.Arch != "gemma3_text" || c.Prefix != "language_model.model." || c.LocalRopeTheta != 10000 || c.Rope.Type != "linear" {
		t.Errorf("gemma3: %+v", c)
	}
}

// TestGemma3NewLayout loads a multimodal Gemma 3 checkpoint in newer
// transformers' names (model.language_model., lm_head).
func TestGemma3NewLayout(t *testing.T) {
	dir := writeTiny(t, testmodel.TinyFamily("gemma3"))
	editHeader(t, filepath.Join(dir, "model.safetensors"), func(h map[string]json.RawMessage) {
		for k, v := range maps.Clone(h) {
			delete(h, k)
			k = strings.Replace(k, "language_model.model.", "model.language_model.", 1)
			k = strings.Replace(k, "language_model.lm_head.", "lm_head.", 1)
			h[k] = v
		}
	})
	c, mods, err := plan(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefix != "model.language_model." || c.Head != "lm_head" || mods[0].Name != "model.language_model.embed_tokens" {
		t.Errorf("prefix %q, head %q, first module %q", c.Prefix, c.Head, mods[0].Name)
	}
}

func TestUnsupportedListsFamilies(t *testing.T) {
	dir := writeTiny(t, testmodel.Tiny())
	editConfig(t, dir, func(m map[string]any) { m["model_type"] = "gpt2" })
	_, _, err := plan(dir)
	for _, want := range []string{"gemma3", "gemma3_text", "gpt_oss", "mixtral", "olmo2", "phi3", "qwen3_moe"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err %v does not list %s", err, want)
		}
	}
}

// TestPlanTransformersV5: config.json as transformers 5 saves it
// (rope_parameters, dtype, num_local_experts) plans the same model as the
// published names.
func TestPlanTransformersV5(t *testing.T) {
	for _, arch := range testmodel.Archs() {
		c := testmodel.TinyFamily(arch)
		want, _, err := plan(writeTiny(t, c))
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		c.TransformersV5 = true
		got, _, err := plan(writeTiny(t, c))
		if err != nil {
			t.Fatalf("%s (v5): %v", arch, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: v5 config plans\n%+v\nwant\n%+v", arch, got, want)
		}
	}
}

// TestWeightBytesSkipsVision: the memory check counts the language model
// of a multimodal Gemma 3 checkpoint, not its vision tower.
func TestWeightBytesSkipsVision(t *testing.T) {
	man := map[string]tensorInfo{
		"language_model.model.embed_tokens.weight":        {DType: "F32", Shape: []int{10, 4}},
		"vision_tower.vision_model.post_layernorm.weight": {DType: "F32", Shape: []int{1000}},
		"multi_modal_projector.mm_soft_emb_norm.weight":   {DType: "F32", Shape: []int{1000}},
		"model.vision_tower.encoder.layers.0.fc1.weight":  {DType: "F32", Shape: []int{1000}},
	}
	if got := weightBytes(man); got != 160 {
		t.Errorf("weightBytes = %d, want 160 (the embedding alone)", got)
	}
}

// TestHostileFamilyConfigs: every edit of enginetest.HostileConfigs is
// refused as a CheckpointError when the model is planned.
func TestHostileFamilyConfigs(t *testing.T) {
	for _, h := range enginetest.HostileConfigs() {
		dir := t.TempDir()
		if err := h.Write(dir); err != nil {
			t.Fatal(err)
		}
		if _, _, err := plan(dir); !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), h.Names) {
			t.Errorf("%s (%s): %v, want a CheckpointError naming %q", h.Name, h.Arch, err, h.Names)
		}
	}
}
