package merge

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"unsafe"

	"github.com/mlxserving/mlxserving/engine"
)

// Key names a generation: requests with equal keys produce equal output.
type Key [sha256.Size]byte

// String returns the key in hex.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Request is what a Key is made of: everything that shapes a
// deterministic generation's output, and nothing that does not (priority,
// client, deadlines).
type Request struct {
	// Model is the model id; Revision tells what the loaded checkpoint
	// answers with apart (the engine and a fingerprint of its files: the
	// same for a reload of the same checkpoint, new for a changed one).
	Model    string
	Revision string
	// Prompt is the prompt's token ids.
	Prompt []int32
	// MaxTokens, Sampling, Stop, StopTokens and IgnoreEOS are the
	// request's generation parameters, StopTokens as the server applies
	// them (with the tokenizer's end tokens).
	MaxTokens  int
	Sampling   engine.SamplingParams
	Stop       []string
	StopTokens []int32
	IgnoreEOS  bool
	// JSONSchema is the request's output constraint (constrained
	// decoding), nil for none.
	JSONSchema []byte
	// KeepCut is api.Params.KeepCut: a constrained output cut where its
	// budget ends instead of closed within it.
	KeepCut bool
	// Pooling, when set, names an embedding of Prompt (pooled this way)
	// rather than a generation.
	Pooling engine.Pooling
	// Adapter names the LoRA adapter the generation runs with and what was
	// loaded under that name; empty for the base model.
	Adapter string
}

// Deterministic reports whether p's output is a function of the request:
// greedy decoding, or sampling with a seed. Only such requests may be
// merged or cached.
func Deterministic(p engine.SamplingParams) bool {
	return p.Temperature == 0 || p.HasSeed
}

// KeyOf hashes r. Every field is length-prefixed, so no two different
// requests share an encoding.
func KeyOf(r Request) Key {
	h := sha256.New()
	var buf [8]byte
	u64 := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	str := func(s string) {
		u64(uint64(len(s)))
		h.Write([]byte(s))
	}
	ids := func(ids []int32) {
		u64(uint64(len(ids)))
		if len(ids) > 0 {
			// The ids' bytes in memory order: keys live in one process,
			// so the host's byte order is the same for every key.
			h.Write(unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*len(ids)))
		}
	}
	flag := func(b bool) {
		if b {
			u64(1)
		} else {
			u64(0)
		}
	}
	str(r.Model)
	str(r.Revision)
	ids(r.Prompt)
	u64(uint64(r.MaxTokens))
	// Every sampling field, including any added later, so a new
	// parameter can never be left out of the key and merge requests it
	// tells apart.
	v := reflect.ValueOf(r.Sampling)
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Bool:
			flag(f.Bool())
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			u64(uint64(f.Int()))
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			u64(f.Uint())
		case reflect.Float32, reflect.Float64:
			u64(math.Float64bits(f.Float()))
		case reflect.String:
			str(f.String())
		default: // slices, maps, pointers: printed in full (maps sorted)
			str(fmt.Sprintf("%#v", f.Interface()))
		}
	}
	u64(uint64(len(r.Stop)))
	for _, st := range r.Stop {
		str(st)
	}
	ids(r.StopTokens)
	flag(r.IgnoreEOS)
	str(string(r.JSONSchema))
	if r.KeepCut {
		flag(true) // keys without it keep their value
	}
	if r.Pooling != engine.PoolNone {
		str("pool:" + r.Pooling.String()) // as KeepCut: other keys keep their value
	}
	if r.Adapter != "" {
		str("adapter:" + r.Adapter)
	}
	var k Key
	h.Sum(k[:0])
	return k
}
