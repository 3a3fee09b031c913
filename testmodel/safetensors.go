package testmodel

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
)

// tensorSpec is one weight: its name, shape and how its values are drawn.
type tensorSpec struct {
	name  string
	shape []int
	std   float64 // values are mean + std*N(0,1)
	mean  float64
}

func (t tensorSpec) numel() int {
	n := 1
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// tensors lists the checkpoint's weights in Hugging Face naming. Linear
// weights are scaled by 1/sqrt(fan-in) so every layer mixes its inputs
// visibly; norms sit around 1; embeddings are unit normal. That keeps the
// logits spread, so greedy decoding depends on the whole context.
func tensors(c Config) []tensorSpec {
	h, hd := c.Hidden, c.HeadDim()
	lin := func(name string, out, in int) tensorSpec {
		return tensorSpec{name: name, shape: []int{out, in}, std: 1 / math.Sqrt(float64(in))}
	}
	norm := func(name string) tensorSpec {
		return tensorSpec{name: name, shape: []int{h}, std: 0.1, mean: 1}
	}
	ts := []tensorSpec{{name: "model.embed_tokens.weight", shape: []int{c.Vocab, h}, std: 1}}
	for i := 0; i < c.Layers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		ts = append(ts,
			norm(p+"input_layernorm.weight"),
			lin(p+"self_attn.q_proj.weight", c.Heads*hd, h),
			lin(p+"self_attn.k_proj.weight", c.KVHeads*hd, h),
			lin(p+"self_attn.v_proj.weight", c.KVHeads*hd, h),
		)
		if c.Arch == "qwen2" {
			ts = append(ts,
				tensorSpec{name: p + "self_attn.q_proj.bias", shape: []int{c.Heads * hd}, std: 0.1},
				tensorSpec{name: p + "self_attn.k_proj.bias", shape: []int{c.KVHeads * hd}, std: 0.1},
				tensorSpec{name: p + "self_attn.v_proj.bias", shape: []int{c.KVHeads * hd}, std: 0.1},
			)
		}
		ts = append(ts,
			lin(p+"self_attn.o_proj.weight", h, c.Heads*hd),
			norm(p+"post_attention_layernorm.weight"),
			lin(p+"mlp.gate_proj.weight", c.Intermediate, h),
			lin(p+"mlp.up_proj.weight", c.Intermediate, h),
			lin(p+"mlp.down_proj.weight", h, c.Intermediate),
		)
	}
	ts = append(ts, norm("model.norm.weight"))
	if !c.TieEmbeddings {
		ts = append(ts, lin("lm_head.weight", c.Vocab, h))
	}
	return ts
}

var dtypeNames = map[string]string{"float32": "F32", "bfloat16": "BF16", "float16": "F16"}

func dtypeSize(dtype string) int {
	switch dtype {
	case "float32":
		return 4
	case "bfloat16", "float16":
		return 2
	}
	return 0
}

// safetensorsHeader is the JSON header and its length prefix, padded with
// spaces to a multiple of 8 bytes.
func safetensorsHeader(ts []tensorSpec, dtype string) []byte {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	off, size := 0, dtypeSize(dtype)
	for _, t := range ts {
		end := off + t.numel()*size
		hdr[t.name] = map[string]any{"dtype": dtypeNames[dtype], "shape": t.shape, "data_offsets": []int{off, end}}
		off = end
	}
	js, _ := json.Marshal(hdr) // maps of strings and ints always marshal
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	return append(out, js...)
}

// chunkElems is how many values one generator draws: tensors are drawn in
// chunks, each from its own generator (seeded by Seed, the tensor's name
// and the chunk's index), so chunks can be drawn in parallel and the file
// still does not depend on the number of CPUs.
const chunkElems = 1 << 20

type chunk struct {
	t     tensorSpec
	index int
	out   chan []byte
}

// writeWeights streams model.safetensors: chunks are drawn by GOMAXPROCS
// goroutines and written in order, with a bounded number in flight, so a
// real-sized model costs a few megabytes per CPU.
func writeWeights(path string, c Config) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	ts := tensors(c)
	if _, err := w.Write(safetensorsHeader(ts, c.DType)); err != nil {
		return err
	}
	workers := runtime.GOMAXPROCS(0)
	jobs := make(chan chunk)
	order := make(chan chunk, 2*workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ch := range jobs {
				ch.out <- drawChunk(ch.t, ch.index, c)
			}
		}()
	}
	stop := make(chan struct{})
	go func() {
		defer close(order)
		defer close(jobs)
		for _, t := range ts {
			for i := 0; i*chunkElems < t.numel(); i++ {
				ch := chunk{t: t, index: i, out: make(chan []byte, 1)}
				select {
				case order <- ch:
				case <-stop:
					return
				}
				select {
				case jobs <- ch:
				case <-stop:
					return
				}
			}
		}
	}()
	for ch := range order {
		if err != nil {
			continue // drain; chunks queued before the stop may lack a job
		}
		if _, err = w.Write(<-ch.out); err != nil {
			close(stop)
		}
	}
	wg.Wait()
	if err != nil {
		return err
	}
	return w.Flush()
}

func drawChunk(t tensorSpec, index int, c Config) []byte {
	h := fnv.New64a()
	h.Write([]byte(t.name))
	rng := rand.New(rand.NewPCG(uint64(c.Seed), h.Sum64()+uint64(index)))
	n := min(chunkElems, t.numel()-index*chunkElems)
	b := make([]byte, 0, n*dtypeSize(c.DType))
	for range n {
		b = appendValue(b, float32(t.mean+t.std*rng.NormFloat64()), c.DType)
	}
	return b
}

func appendValue(b []byte, v float32, dtype string) []byte {
	switch dtype {
	case "bfloat16":
		return binary.LittleEndian.AppendUint16(b, bfloat16(v))
	case "float16":
		return binary.LittleEndian.AppendUint16(b, float16(v))
	}
	return binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
}

// bfloat16 rounds to nearest even (finite inputs only, as drawn here).
func bfloat16(v float32) uint16 {
	bits := math.Float32bits(v)
	bits += 0x7FFF + (bits>>16)&1
	return uint16(bits >> 16)
}

// float16 converts to IEEE half precision, rounding to nearest even,
// flushing values too small for half to signed zero or subnormals and
// saturating values too large to infinity.
func float16(v float32) uint16 {
	bits := math.Float32bits(v)
	sign := uint16(bits>>16) & 0x8000
	exp := int(bits>>23&0xFF) - 127 + 15
	mant := bits & 0x7FFFFF
	switch {
	case exp >= 31:
		return sign | 0x7C00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - exp)
		half := mant >> shift
		rem := mant & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	half := uint32(exp)<<10 | mant>>13
	rem := mant & 0x1FFF
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent, which is correct rounding
	}
	return sign | uint16(half)
}
