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

// tensors lists the checkpoint's weights in Hugging Face naming, in the
// family's layout (families.go). Embeddings are unit normal, which keeps
// the logits spread, so greedy decoding depends on the whole context.
func tensors(c Config) []tensorSpec {
	if IsEncoder(c.Arch) {
		return encoderTensors(c)
	}
	fam := families[c.Arch]
	p := fam.prefix
	if c.BaseModel {
		p = ""
	}
	embed := tensorSpec{name: p + "embed_tokens.weight", shape: []int{c.Vocab, c.Hidden}, std: 1}
	if isGemma(c.Arch) {
		// Gemma scales the embedding by sqrt(hidden): rows of norm about
		// 1, as in the published weights, keep it level with what the
		// layers add instead of drowning it (greedy output then repeats
		// the last prompt token).
		embed.std = 1 / math.Sqrt(float64(c.Hidden))
	}
	ts := []tensorSpec{embed}
	for i := 0; i < c.Layers; i++ {
		ts = fam.layer(c, i, fmt.Sprintf("%slayers.%d.", p, i), ts)
	}
	ts = append(ts, norm(c, p+"norm.weight", c.Hidden))
	if !c.TieEmbeddings && !c.BaseModel {
		head := "lm_head.weight"
		if c.Arch == "gemma3" {
			head = "language_model.lm_head.weight"
		}
		ts = append(ts, lin(head, c.Vocab, c.Hidden))
	}
	if c.Arch == "gemma3" { // a token of the vision tower, which text engines skip
		ts = append(ts,
			tensorSpec{name: "multi_modal_projector.mm_soft_emb_norm.weight", shape: []int{16}, std: 0.1},
			lin("vision_tower.vision_model.post_layernorm.weight", 1, 16),
		)
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
func safetensorsHeader(fts []fileTensor) []byte {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	off := 0
	for _, t := range fts {
		end := off + t.bytes()
		hdr[t.name] = map[string]any{"dtype": t.dtype, "shape": t.shape, "data_offsets": []int{off, end}}
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

// A chunk is a job: values index*chunkElems.. of t, or (whole) all of a
// weight the layout quantizes, which needs every value at once.
type chunk struct {
	t     tensorSpec
	index int
	whole bool
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
	var fts []fileTensor
	for _, t := range ts {
		fts = append(fts, c.fileTensors(t)...)
	}
	if _, err := w.Write(safetensorsHeader(fts)); err != nil {
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
				if ch.whole && !c.quantized(ch.t) {
					ch.out <- encode(c.merge(ch.t, drawWhole(ch.t, c)), c.DType)
				} else if ch.whole {
					ch.out <- c.quantize(ch.t, c.merge(ch.t, drawWhole(ch.t, c)))
				} else {
					ch.out <- encode(drawChunk(ch.t, ch.index, c), c.DType)
				}
			}
		}()
	}
	stop := make(chan struct{})
	go func() {
		defer close(order)
		defer close(jobs)
		for _, t := range ts {
			whole := c.quantized(t) || c.merged(t)
			for i := 0; i*chunkElems < t.numel() && (i == 0 || !whole); i++ {
				ch := chunk{t: t, index: i, whole: whole, out: make(chan []byte, 1)}
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

// drawChunk draws values index*chunkElems.. of t, rounded to DType: the
// values the file holds.
func drawChunk(t tensorSpec, index int, c Config) []float32 {
	h := fnv.New64a()
	h.Write([]byte(t.name))
	rng := rand.New(rand.NewPCG(uint64(c.Seed), h.Sum64()+uint64(index)))
	n := min(chunkElems, t.numel()-index*chunkElems)
	vs := make([]float32, n)
	for i := range vs {
		vs[i] = roundTo(float32(t.mean+t.std*rng.NormFloat64()), c.DType)
	}
	return vs
}

// drawWhole draws all of t, chunk by chunk: the same values the float
// model's file holds.
func drawWhole(t tensorSpec, c Config) []float32 {
	vs := make([]float32, 0, t.numel())
	for i := 0; i*chunkElems < t.numel(); i++ {
		vs = append(vs, drawChunk(t, i, c)...)
	}
	return vs
}

func encode(vs []float32, dtype string) []byte {
	b := make([]byte, 0, len(vs)*dtypeSize(dtype))
	for _, v := range vs {
		b = appendValue(b, v, dtype)
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
