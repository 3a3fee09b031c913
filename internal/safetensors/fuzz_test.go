package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// FuzzRead: any file is either refused with a CheckpointError or gives a
// header whose every tensor lies inside the file, with a byte count that
// matches its dtype and shape, and no two tensors sharing bytes.
func FuzzRead(f *testing.F) {
	f.Add(file(good, 32))
	f.Add(file(`{"a":{"dtype":"F32","shape":[50000,50000],"data_offsets":[0,10000000000]}}`, 8))
	f.Add(file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 8))
	f.Add(file(`{"a":{"dtype":"F32","shape":[2147483647,2147483647,4],"data_offsets":[0,0]}}`, 0))
	f.Add(file(`{"__metadata__":{"k":"v"},"e":{"dtype":"BOOL","shape":[0,5],"data_offsets":[0,0]}}`, 0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Read(bytes.NewReader(b), int64(len(b)), "fuzz.safetensors")
		if err != nil {
			var ce *engine.CheckpointError
			if !errors.As(err, &ce) {
				t.Fatalf("%T %v is not a CheckpointError", err, err)
			}
			return
		}
		n := binary.LittleEndian.Uint64(b)
		if h.DataOffset != int64(8+n) {
			t.Fatalf("data offset %d for header length %d", h.DataOffset, n)
		}
		dataLen := int64(len(b)) - h.DataOffset
		type span struct{ b, e int64 }
		var used []span
		for name, ts := range h.Tensors {
			size, ok := DTypeSize(ts.DType)
			if !ok {
				t.Fatalf("%s: dtype %q accepted", name, ts.DType)
			}
			want := int64(size)
			for _, d := range ts.Shape {
				want *= int64(d)
			}
			if ts.Begin < 0 || ts.End > dataLen || ts.End-ts.Begin != want {
				t.Fatalf("%s: [%d, %d) of %d bytes, shape %v of %s", name, ts.Begin, ts.End, dataLen, ts.Shape, ts.DType)
			}
			for _, u := range used {
				if ts.Begin < u.e && u.b < ts.End {
					t.Fatalf("%s overlaps another tensor", name)
				}
			}
			used = append(used, span{ts.Begin, ts.End})
		}
	})
}
