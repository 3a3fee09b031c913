package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// file builds a safetensors file from a header's JSON and data bytes.
func file(header string, data int) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(make([]byte, data))
	return b.Bytes()
}

func write(t *testing.T, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const good = `{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"empty":{"dtype":"F16","shape":[0],"data_offsets":[32,32]}}`

func TestReadGood(t *testing.T) {
	h, err := ReadFile(write(t, file(good, 32)))
	if err != nil {
		t.Fatal(err)
	}
	a := h.Tensors["a"]
	if len(h.Tensors) != 3 || a.DType != "F32" || len(a.Shape) != 2 || a.Shape[1] != 3 || a.End != 24 || h.Metadata["format"] != "pt" || h.DataOffset != int64(8+len(good)) {
		t.Fatalf("%+v", h)
	}
}

func TestReadTestModel(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(files) == 0 {
		t.Fatal("no safetensors written")
	}
	for _, f := range files {
		h, err := ReadFile(f)
		if err != nil || len(h.Tensors) == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

// TestHostileFiles: each crafted or damaged file gives a CheckpointError
// naming the problem.
func TestHostileFiles(t *testing.T) {
	whole := file(good, 32)
	lenOnly := make([]byte, 8)
	binary.LittleEndian.PutUint64(lenOnly, 1<<62)
	cases := []struct {
		name   string
		b      []byte
		tensor string
		want   string
	}{
		{"empty file", nil, "", "too short"},
		{"header length past the end", append(lenOnly, '{', '}'), "", "does not fit"},
		{"truncated header", whole[:20], "", "does not fit"},
		{"truncated data", whole[:len(whole)-5], "b", "outside the 27 data bytes"}, // "b" sorts before "empty"
		{"offsets past the end", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, 8), "a", "outside"},
		{"10 GB declared tensor", file(`{"w":{"dtype":"F32","shape":[50000,50000],"data_offsets":[0,10000000000]}}`, 64), "w", "outside"},
		{"unknown dtype", file(`{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}}`, 2), "a", "unknown dtype"},
		{"shape does not match offsets", file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), "a", "needs 12"},
		{"negative dimension", file(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,0]}}`, 0), "a", "dimension 0"},
		{"overflowing shape", file(`{"a":{"dtype":"F32","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,4]}}`, 4), "a", "overflows"},
		{"reversed offsets", file(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}}`, 4), "a", "outside"},
		{"three offsets", file(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}}`, 4), "a", "outside"},
		{"negative offset", file(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}}`, 4), "a", "corrupt header entry"},
		{"missing field", file(`{"a":{"dtype":"U8","shape":[2]}}`, 4), "a", "needs dtype"},
		{"overlapping tensors", file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 8), "b", "overlaps"},
		{"not JSON", file(`{"a":`, 4), "", "JSON object"},
		{"JSON array", file(`[1,2]`, 4), "", "JSON object"},
		{"entry not an object", file(`{"a":7}`, 4), "a", "corrupt header entry"},
		{"bad metadata", file(`{"__metadata__":{"a":1}}`, 4), "", "__metadata__"},
		{"deep nesting", file(`{"a":`+strings.Repeat("[", 20000)+strings.Repeat("]", 20000)+`}`, 0), "", ""},
	}
	for _, c := range cases {
		_, err := ReadFile(write(t, c.b))
		var ce *engine.CheckpointError
		if !errors.As(err, &ce) || !errors.Is(err, engine.ErrBadCheckpoint) || ce.Tensor != c.tensor || !strings.Contains(ce.Reason, c.want) {
			t.Errorf("%s: %v (tensor %q); want tensor %q, reason containing %q", c.name, err, func() string {
				if ce != nil {
					return ce.Tensor
				}
				return ""
			}(), c.tensor, c.want)
		}
	}
	dir := t.TempDir()
	if _, err := ReadFile(dir); !errors.Is(err, engine.ErrBadCheckpoint) {
		t.Errorf("directory: %v", err)
	}
}
