// Package safetensors reads and checks the header of a .safetensors file,
// treating the file as hostile: every size and offset is checked against
// the file before anything is allocated from it, so a truncated or crafted
// file gives an *engine.CheckpointError, never a panic or a huge
// allocation. Engines use it before handing a file to their own loader.
// [Fingerprint] names a checkpoint directory for caches without reading
// all of its weights.
//
//	h, err := safetensors.ReadFile(path)
//	for name, t := range h.Tensors { fmt.Println(name, t.DType, t.Shape) }
//
// The format: 8 bytes little-endian header length N, N bytes of JSON
// mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data after the header) plus an optional
// "__metadata__" map of strings, then the data.
package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/bits"
	"os"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// MaxHeaderBytes bounds the JSON header (real ones are well under 10 MB).
const MaxHeaderBytes = 100 << 20

// maxDims bounds a tensor's rank.
const maxDims = 8

// Tensor is one header entry.
type Tensor struct {
	DType string
	Shape []int
	// Begin and End are the tensor's bytes relative to Header.DataOffset.
	Begin, End int64
}

// Header is a checked safetensors header.
type Header struct {
	// DataOffset is where the data starts in the file (8 + header length).
	DataOffset int64
	// Tensors maps names to entries; every entry lies inside the file.
	Tensors map[string]Tensor
	// Metadata is the "__metadata__" map, if any.
	Metadata map[string]string
}

// DTypeSize returns the bytes per element of a safetensors dtype, and
// false for a dtype this reader does not know.
func DTypeSize(dtype string) (int, bool) {
	switch dtype {
	case "F64", "I64", "U64":
		return 8, true
	case "F32", "I32", "U32":
		return 4, true
	case "F16", "BF16", "I16", "U16":
		return 2, true
	case "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2":
		return 1, true
	}
	return 0, false
}

// ReadFile reads and checks the header of the file at path.
func ReadFile(path string) (*Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &engine.CheckpointError{Path: path, Reason: err.Error()}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, &engine.CheckpointError{Path: path, Reason: err.Error()}
	}
	if !st.Mode().IsRegular() {
		return nil, &engine.CheckpointError{Path: path, Reason: "not a regular file"}
	}
	return Read(f, st.Size(), path)
}

// Read reads and checks the header of a size-byte file read through r;
// path names it in errors.
func Read(r io.ReaderAt, size int64, path string) (*Header, error) {
	bad := func(format string, args ...any) error {
		return &engine.CheckpointError{Path: path, Reason: "corrupt safetensors: " + fmt.Sprintf(format, args...)}
	}
	var lenBuf [8]byte
	if size < 8 {
		return nil, bad("%d-byte file is too short for a header", size)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, bad("reading the header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n < 2 || n > MaxHeaderBytes || n > uint64(size-8) {
		return nil, bad("header length %d does not fit a %d-byte file (limit %d)", n, size, MaxHeaderBytes)
	}
	hb := make([]byte, n)
	if _, err := r.ReadAt(hb, 8); err != nil {
		return nil, bad("reading the %d-byte header: %v", n, err)
	}
	h, err := ParseHeader(hb, size-8-int64(n), path)
	if err != nil {
		return nil, err
	}
	h.DataOffset = 8 + int64(n)
	return h, nil
}

// ParseHeader checks a header's JSON against the dataLen bytes of data that
// follow it. DataOffset is left to the caller.
func ParseHeader(header []byte, dataLen int64, path string) (*Header, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(header))
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return nil, &engine.CheckpointError{Path: path, Reason: fmt.Sprintf("corrupt safetensors header: want a JSON object (%v)", err)}
	}
	h := &Header{Tensors: make(map[string]Tensor, len(raw))}
	// In name order, so the same bad file always names the same tensor.
	names := slices.Sorted(maps.Keys(raw))
	for _, name := range names {
		msg := raw[name]
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, &engine.CheckpointError{Path: path, Reason: "corrupt safetensors header: __metadata__ must map strings to strings"}
			}
			continue
		}
		t, reason := parseEntry(msg, dataLen)
		if reason != "" {
			return nil, &engine.CheckpointError{Path: path, Tensor: name, Reason: reason}
		}
		h.Tensors[name] = t
	}
	if err := checkOverlap(h.Tensors, path); err != nil {
		return nil, err
	}
	return h, nil
}

// parseEntry checks one tensor entry; reason is "" when it is good.
func parseEntry(msg json.RawMessage, dataLen int64) (Tensor, string) {
	var e struct {
		DType   *string  `json:"dtype"`
		Shape   []int64  `json:"shape"`
		Offsets []uint64 `json:"data_offsets"`
	}
	if err := json.Unmarshal(msg, &e); err != nil {
		return Tensor{}, "corrupt header entry: " + err.Error()
	}
	if e.DType == nil || e.Shape == nil || e.Offsets == nil {
		return Tensor{}, "header entry needs dtype, shape and data_offsets"
	}
	size, ok := DTypeSize(*e.DType)
	if !ok {
		return Tensor{}, fmt.Sprintf("unknown dtype %q", *e.DType)
	}
	if len(e.Shape) > maxDims {
		return Tensor{}, fmt.Sprintf("%d dimensions; at most %d are supported", len(e.Shape), maxDims)
	}
	// The tensor's byte count, refusing overflow: a crafted shape must not
	// wrap around to a small number that matches its offsets.
	want := uint64(size)
	shape := make([]int, len(e.Shape))
	for i, d := range e.Shape {
		if d < 0 || d > math.MaxInt32 {
			return Tensor{}, fmt.Sprintf("dimension %d is %d", i, d)
		}
		hi, lo := bits.Mul64(want, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return Tensor{}, fmt.Sprintf("shape %v overflows", e.Shape)
		}
		want, shape[i] = lo, int(d)
	}
	if len(e.Offsets) != 2 || e.Offsets[0] > e.Offsets[1] || e.Offsets[1] > uint64(dataLen) {
		return Tensor{}, fmt.Sprintf("data offsets %v outside the %d data bytes (truncated file?)", e.Offsets, dataLen)
	}
	if got := e.Offsets[1] - e.Offsets[0]; got != want {
		return Tensor{}, fmt.Sprintf("holds %d bytes; shape %v of %s needs %d", got, e.Shape, *e.DType, want)
	}
	return Tensor{DType: *e.DType, Shape: shape, Begin: int64(e.Offsets[0]), End: int64(e.Offsets[1])}, ""
}

// checkOverlap refuses tensors that share bytes: a crafted file could
// otherwise alias one tensor's data as another's.
func checkOverlap(ts map[string]Tensor, path string) error {
	type span struct {
		name       string
		begin, end int64
	}
	spans := make([]span, 0, len(ts))
	for name, t := range ts {
		if t.End > t.Begin {
			spans = append(spans, span{name, t.Begin, t.End})
		}
	}
	slices.SortFunc(spans, func(a, b span) int {
		return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end))
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return &engine.CheckpointError{Path: path, Tensor: spans[i].name,
				Reason: fmt.Sprintf("data overlaps tensor %q", spans[i-1].name)}
		}
	}
	return nil
}
