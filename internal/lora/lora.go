// Package lora reads LoRA adapters as fine-tuning tools save them and
// checks them against the model they adapt, treating the files as
// hostile: PEFT's layout (adapter_config.json and
// adapter_model.safetensors, tensors named
// base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight with A
// [r, in] and B [out, r]) and mlx-lm's (adapter_config.json with
// lora_parameters and adapters.safetensors, model.layers.N.….lora_a [in,
// r] and lora_b [r, out]). Both engines use it: what is served is the
// same whatever engine serves it, and a bad adapter gets the same
// *engine.CheckpointError from either.
//
//	a, err := lora.Read(dir)
//	base, err := lora.ReadBase(modelDir)
//	err = a.Check(base, maxRank)
//	for _, p := range a.Pairs { A, B, err := a.Load(p) }
package lora

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/safetensors"
)

// Formats an adapter directory may be in.
const (
	FormatPEFT = "peft"
	FormatMLX  = "mlx"
)

// Adapter is an adapter directory read and its tensors indexed; the
// weights stay on disk until Load.
type Adapter struct {
	Dir    string
	Format string
	Rank   int
	// Scale multiplies B·A (see engine.AdapterInfo.Scale).
	Scale float64
	// Pairs are the adapted projections, by layer then module.
	Pairs []Pair

	file   string
	header *safetensors.Header
}

// Pair is one adapted projection: y += Scale · B(A x).
type Pair struct {
	Layer int
	// Module is "self_attn.q_proj", "mlp.down_proj" and so on.
	Module string
	// A and B are the tensors' names in the file.
	A, B string
	// In and Out are the projection's input and output widths.
	In, Out int
	// Transposed says the file holds A as [in, r] and B as [r, out]
	// (mlx-lm); PEFT holds A [r, in] and B [out, r].
	Transposed bool
}

// Targets are the adapted module names (q_proj, down_proj, ...), sorted.
func (a *Adapter) Targets() []string {
	var out []string
	for _, p := range a.Pairs {
		name := filepath.Ext(p.Module)[1:]
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Layers is the number of distinct layers adapted.
func (a *Adapter) Layers() int {
	seen := map[int]bool{}
	for _, p := range a.Pairs {
		seen[p.Layer] = true
	}
	return len(seen)
}

// Bytes is the size of the adapter's weights at elemSize bytes a value.
func (a *Adapter) Bytes(elemSize int) int64 {
	var n int64
	for _, p := range a.Pairs {
		n += int64(a.Rank) * int64(p.In+p.Out) * int64(elemSize)
	}
	return n
}

// Info is the engine's description of the adapter served as name.
func (a *Adapter) Info(name string, elemSize int) engine.AdapterInfo {
	return engine.AdapterInfo{Name: name, Path: a.Dir, Format: a.Format, Rank: a.Rank, Scale: a.Scale,
		Targets: a.Targets(), Layers: a.Layers(), Bytes: a.Bytes(elemSize)}
}

func bad(path, tensor, format string, args ...any) error {
	return &engine.CheckpointError{Path: path, Tensor: tensor, Reason: fmt.Sprintf(format, args...)}
}

// maxConfigBytes bounds adapter_config.json (real ones are a few KB).
const maxConfigBytes = 1 << 20

// Read reads the adapter in dir. Errors are *engine.CheckpointError.
func Read(dir string) (*Adapter, error) {
	cfgPath := filepath.Join(dir, "adapter_config.json")
	raw, err := readSmall(cfgPath)
	if err != nil {
		return nil, err
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, bad(cfgPath, "", "not a JSON object: %v", err)
	}
	a := &Adapter{Dir: dir}
	if _, ok := cfg["lora_parameters"]; ok {
		a.Format = FormatMLX
		err = a.mlxConfig(cfgPath, cfg)
	} else {
		a.Format = FormatPEFT
		err = a.peftConfig(cfgPath, cfg)
	}
	if err != nil {
		return nil, err
	}
	file := "adapter_model.safetensors"
	if a.Format == FormatMLX {
		file = "adapters.safetensors"
	}
	a.file = filepath.Join(dir, file)
	if _, err := os.Stat(a.file); err != nil {
		if a.Format == FormatPEFT {
			if _, binErr := os.Stat(filepath.Join(dir, "adapter_model.bin")); binErr == nil {
				return nil, bad(a.file, "", "missing: only adapter_model.bin (a pickle) is there; save the adapter with safe_serialization")
			}
		}
		return nil, bad(a.file, "", "missing: %v", err)
	}
	if a.header, err = safetensors.ReadFile(a.file); err != nil {
		return nil, err
	}
	if err := a.index(); err != nil {
		return nil, err
	}
	return a, nil
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, bad(path, "", "missing: %v", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, bad(path, "", "unreadable: %v", err)
	}
	if len(raw) > maxConfigBytes {
		return nil, bad(path, "", "larger than %d bytes", maxConfigBytes)
	}
	return raw, nil
}

// peftConfig reads PEFT's LoraConfig, refusing what the engines do not
// run: other PEFT methods, DoRA, per-module ranks, Conv1D layouts, trained
// biases and fully trained extra modules.
func (a *Adapter) peftConfig(path string, cfg map[string]json.RawMessage) error {
	var c struct {
		PeftType      string          `json:"peft_type"`
		R             float64         `json:"r"`
		Alpha         *float64        `json:"lora_alpha"`
		RSLoRA        bool            `json:"use_rslora"`
		DoRA          bool            `json:"use_dora"`
		FanInFanOut   bool            `json:"fan_in_fan_out"`
		Bias          string          `json:"bias"`
		ModulesToSave []string        `json:"modules_to_save"`
		RankPattern   map[string]any  `json:"rank_pattern"`
		AlphaPattern  map[string]any  `json:"alpha_pattern"`
		LayerReplic   json.RawMessage `json:"layer_replication"`
	}
	raw, _ := json.Marshal(cfg)
	if err := json.Unmarshal(raw, &c); err != nil {
		return bad(path, "", "unexpected field type: %v", err)
	}
	switch {
	case c.PeftType != "" && c.PeftType != "LORA":
		return bad(path, "", "peft_type %q: only LORA adapters are served", c.PeftType)
	case c.DoRA:
		return bad(path, "", "use_dora: DoRA adapters are not served")
	case c.FanInFanOut:
		return bad(path, "", "fan_in_fan_out: Conv1D (GPT-2 style) layouts are not served")
	case c.Bias != "" && c.Bias != "none":
		return bad(path, "", "bias %q: adapters that train biases are not served", c.Bias)
	case len(c.ModulesToSave) > 0:
		return bad(path, "", "modules_to_save %v: adapters that retrain whole modules are not served", c.ModulesToSave)
	case len(c.RankPattern) > 0 || len(c.AlphaPattern) > 0:
		return bad(path, "", "rank_pattern/alpha_pattern: per-module ranks are not served")
	case len(c.LayerReplic) > 0 && string(c.LayerReplic) != "null":
		return bad(path, "", "layer_replication is not served")
	case c.R < 1 || c.R != math.Trunc(c.R):
		return bad(path, "", "r %v: want a positive integer", c.R)
	}
	a.Rank = int(c.R)
	alpha := float64(a.Rank) // PEFT's default lora_alpha is 8 with r 8: scale 1
	if c.Alpha != nil {
		alpha = *c.Alpha
	}
	if math.IsNaN(alpha) || math.IsInf(alpha, 0) {
		return bad(path, "", "lora_alpha %v is not finite", alpha)
	}
	a.Scale = alpha / float64(a.Rank)
	if c.RSLoRA {
		a.Scale = alpha / math.Sqrt(float64(a.Rank))
	}
	return nil
}

// mlxConfig reads mlx-lm's adapter configuration: lora_parameters' rank
// and scale (the multiplier itself, not an alpha).
func (a *Adapter) mlxConfig(path string, cfg map[string]json.RawMessage) error {
	var c struct {
		FineTuneType string `json:"fine_tune_type"`
		UseDoRA      bool   `json:"use_dora"`
		Params       struct {
			Rank  float64  `json:"rank"`
			Scale *float64 `json:"scale"`
		} `json:"lora_parameters"`
	}
	raw, _ := json.Marshal(cfg)
	if err := json.Unmarshal(raw, &c); err != nil {
		return bad(path, "", "unexpected field type: %v", err)
	}
	switch {
	case c.FineTuneType != "" && c.FineTuneType != "lora":
		return bad(path, "", "fine_tune_type %q: only lora adapters are served", c.FineTuneType)
	case c.UseDoRA:
		return bad(path, "", "use_dora: DoRA adapters are not served")
	case c.Params.Rank < 1 || c.Params.Rank != math.Trunc(c.Params.Rank):
		return bad(path, "", "lora_parameters.rank %v: want a positive integer", c.Params.Rank)
	case c.Params.Scale == nil:
		return bad(path, "", "lora_parameters.scale is missing")
	case math.IsNaN(*c.Params.Scale) || math.IsInf(*c.Params.Scale, 0):
		return bad(path, "", "lora_parameters.scale %v is not finite", *c.Params.Scale)
	}
	a.Rank, a.Scale = int(c.Params.Rank), *c.Params.Scale
	return nil
}

// Tensor names: PEFT's wraps the model's own (model., language_model.model.
// or model.language_model. for Gemma 3) in base_model.model.; mlx-lm's are
// the model's. Adapter names ("default") may be left in by older savers.
var (
	peftName = regexp.MustCompile(`^base_model\.model\.(?:model\.|language_model\.model\.|model\.language_model\.)?layers\.(\d+)\.((?:self_attn|mlp)\.\w+)\.lora_([AB])(?:\.default)?\.weight$`)
	mlxName  = regexp.MustCompile(`^(?:model\.|language_model\.model\.|model\.language_model\.)?layers\.(\d+)\.((?:self_attn|mlp)\.\w+)\.lora_([ab])$`)
)

// maxLayer bounds a layer index read from a name before it sizes anything.
const maxLayer = 1 << 12

// index pairs the file's A and B tensors by projection and checks their
// shapes against each other and the rank.
func (a *Adapter) index() error {
	re := peftName
	if a.Format == FormatMLX {
		re = mlxName
	}
	type half struct{ a, b string }
	pairs := map[[2]string]*half{}
	names := make([]string, 0, len(a.header.Tensors))
	for n := range a.header.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		m := re.FindStringSubmatch(n)
		if m == nil {
			return bad(a.file, n, "not a LoRA A or B weight of a decoder layer's projection (only those are served)")
		}
		if l, err := strconv.Atoi(m[1]); err != nil || l >= maxLayer {
			return bad(a.file, n, "layer index out of range")
		}
		key := [2]string{m[1], m[2]}
		h := pairs[key]
		if h == nil {
			h = &half{}
			pairs[key] = h
		}
		if m[3] == "A" || m[3] == "a" {
			h.a = n
		} else {
			h.b = n
		}
	}
	if len(pairs) == 0 {
		return bad(a.file, "", "holds no LoRA weights")
	}
	for key, h := range pairs {
		if h.a == "" || h.b == "" {
			return bad(a.file, h.a+h.b, "its LoRA pair is missing")
		}
		ta, tb := a.header.Tensors[h.a], a.header.Tensors[h.b]
		for name, t := range map[string]safetensors.Tensor{h.a: ta, h.b: tb} {
			if len(t.Shape) != 2 {
				return bad(a.file, name, "shape %v: want two dimensions", t.Shape)
			}
			if _, ok := floatSize[t.DType]; !ok {
				return bad(a.file, name, "dtype %s: want F32, F16 or BF16", t.DType)
			}
		}
		l, _ := strconv.Atoi(key[0])
		p := Pair{Layer: l, Module: key[1], A: h.a, B: h.b, Transposed: a.Format == FormatMLX}
		ra, in := ta.Shape[0], ta.Shape[1]
		out, rb := tb.Shape[0], tb.Shape[1]
		if p.Transposed {
			in, ra = ta.Shape[0], ta.Shape[1]
			rb, out = tb.Shape[0], tb.Shape[1]
		}
		if ra != a.Rank || rb != a.Rank {
			return bad(a.file, h.a, "rank %d (B: %d) where the configuration says %d", ra, rb, a.Rank)
		}
		p.In, p.Out = in, out
		a.Pairs = append(a.Pairs, p)
	}
	sort.Slice(a.Pairs, func(i, j int) bool {
		if a.Pairs[i].Layer != a.Pairs[j].Layer {
			return a.Pairs[i].Layer < a.Pairs[j].Layer
		}
		return a.Pairs[i].Module < a.Pairs[j].Module
	})
	return nil
}

var floatSize = map[string]int{"F32": 4, "F16": 2, "BF16": 2}

// Check checks the adapter against base: every layer exists, every module
// is one base can adapt with its widths, the rank is at most maxRank.
func (a *Adapter) Check(base Base, maxRank int) error {
	if maxRank > 0 && a.Rank > maxRank {
		return bad(a.Dir, "", "rank %d is above the highest this model takes (%d; raise ModelSpec.MaxAdapterRank)", a.Rank, maxRank)
	}
	for _, p := range a.Pairs {
		if p.Layer >= base.Layers {
			return bad(a.file, p.A, "layer %d: the model has %d", p.Layer, base.Layers)
		}
		shape, ok := base.Modules[p.Module]
		if !ok {
			return bad(a.file, p.A, "module %s: the model has no such projection to adapt (it adapts %v)", p.Module, base.ModuleNames())
		}
		if base.Dense != nil && !base.Dense[p.Layer] && p.Module[:4] == "mlp." {
			return bad(a.file, p.A, "layer %d is a mixture of experts: its experts are not adapted", p.Layer)
		}
		if shape[0] != p.In || shape[1] != p.Out {
			return bad(a.file, p.A, "%s is %d→%d in the adapter, %d→%d in the model", p.Module, p.In, p.Out, shape[0], shape[1])
		}
	}
	return nil
}

// Load reads one pair's weights as float32, A as [Rank, In] and B as
// [Out, Rank] row-major whatever the file's layout, refusing values that
// are not finite.
func (a *Adapter) Load(p Pair) (A, B []float32, err error) {
	f, err := os.Open(a.file)
	if err != nil {
		return nil, nil, bad(a.file, "", "unreadable: %v", err)
	}
	defer f.Close()
	if A, err = a.read(f, p.A); err != nil {
		return nil, nil, err
	}
	if B, err = a.read(f, p.B); err != nil {
		return nil, nil, err
	}
	if p.Transposed {
		A = transpose(A, p.In, a.Rank)
		B = transpose(B, a.Rank, p.Out)
	}
	return A, B, nil
}

// CheckFinite loads every pair once, refusing NaN and infinite weights.
func (a *Adapter) CheckFinite() error {
	for _, p := range a.Pairs {
		if _, _, err := a.Load(p); err != nil {
			return err
		}
	}
	return nil
}

func (a *Adapter) read(f *os.File, name string) ([]float32, error) {
	t := a.header.Tensors[name]
	buf := make([]byte, t.End-t.Begin)
	if _, err := f.ReadAt(buf, a.header.DataOffset+t.Begin); err != nil {
		return nil, bad(a.file, name, "unreadable: %v", err)
	}
	size := floatSize[t.DType]
	out := make([]float32, len(buf)/size)
	for i := range out {
		var v float32
		switch t.DType {
		case "F32":
			v = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		case "BF16":
			v = math.Float32frombits(uint32(binary.LittleEndian.Uint16(buf[2*i:])) << 16)
		case "F16":
			v = half(binary.LittleEndian.Uint16(buf[2*i:]))
		}
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, bad(a.file, name, "value %d is %v: the adapter's weights must be finite", i, v)
		}
		out[i] = v
	}
	return out, nil
}

// transpose returns the [cols, rows] transpose of the row-major [rows, cols] m.
func transpose(m []float32, rows, cols int) []float32 {
	out := make([]float32, len(m))
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			out[c*rows+r] = m[r*cols+c]
		}
	}
	return out
}

// half converts IEEE half precision to float32.
func half(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1F
	mant := uint32(h & 0x3FF)
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		return float32(math.Copysign(float64(mant)*math.Pow(2, -24), float64(int32(sign)|1)))
	case exp == 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}
