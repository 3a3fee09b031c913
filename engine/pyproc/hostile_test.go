package pyproc

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// stFile is a safetensors file with the given header and 64 data bytes.
func stFile(header string) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), make([]byte, 64)...)
}

// TestHostileCheckpoints: crafted safetensors headers and config files are
// refused by the Python side with a CheckpointError naming the problem,
// before any weight is read, and the worker keeps serving.
func TestHostileCheckpoints(t *testing.T) {
	e := newEngine(t)
	weights := func(header string) func(string) {
		return func(d string) {
			if err := os.WriteFile(filepath.Join(d, "model.safetensors"), stFile(header), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name, path, tensor, want string
		edit                     func(dir string)
	}{
		{"10 GB declared tensor", "model.safetensors", "w", "outside the 64 data bytes",
			weights(`{"w":{"dtype":"F32","shape":[50000,50000],"data_offsets":[0,10000000000]}}`)},
		{"offsets past the end", "model.safetensors", "w", "outside", weights(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[56,72]}}`)},
		{"unknown dtype", "model.safetensors", "w", "unsupported dtype", weights(`{"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,2]}}`)},
		{"shape mismatch", "model.safetensors", "w", "do not fit shape", weights(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`)},
		{"entry not an object", "model.safetensors", "w", "not an object", weights(`{"w":[1,2]}`)},
		{"bad offsets", "model.safetensors", "w", "bad data_offsets", weights(`{"w":{"dtype":"F32","shape":[2],"data_offsets":"0-8"}}`)},
		{"float shape", "model.safetensors", "w", "bad shape", weights(`{"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}`)},
		{"overlap", "model.safetensors", "b", "overlaps", weights(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`)},
		{"header not an object", "model.safetensors", "", "not a JSON object", weights(`[1,2,3]`)},
		{"header length past the end", "model.safetensors", "", "exceeds the file", func(d string) {
			os.WriteFile(filepath.Join(d, "model.safetensors"), binary.LittleEndian.AppendUint64(nil, 1<<40), 0o644)
		}},
		{"config is a list", "config.json", "", "not a JSON object", func(d string) {
			os.WriteFile(filepath.Join(d, "config.json"), []byte(`[1]`), 0o644)
		}},
		{"huge config sizes", "config.json", "", "beyond any supported model", func(d string) { editConfig(t, d, "max_position_embeddings", 1<<40) }},
		{"bad rope scaling", "config.json", "", "rope_scaling", func(d string) { editConfig(t, d, "rope_scaling", []int{1}) }},
		{"bad eos", "generation_config.json", "", "eos_token_id", func(d string) {
			os.WriteFile(filepath.Join(d, "generation_config.json"), []byte(`{"eos_token_id": "</s>"}`), 0o644)
		}},
		{"huge config.json", "config.json", "", "larger than", func(d string) {
			os.WriteFile(filepath.Join(d, "config.json"), make([]byte, 5<<20), 0o644)
		}},
	}
	for _, tc := range cases {
		_, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: badCheckpoint(t, tc.edit)})
		var ce *engine.CheckpointError
		if !errors.As(err, &ce) || !errors.Is(err, engine.ErrBadCheckpoint) {
			t.Errorf("%s: %v, want a CheckpointError", tc.name, err)
			continue
		}
		if ce.Path != tc.path || ce.Tensor != tc.tensor || !strings.Contains(ce.Reason, tc.want) {
			t.Errorf("%s: %v names %q / %q, want %q / %q saying %q", tc.name, err, ce.Path, ce.Tensor, tc.path, tc.tensor, tc.want)
		}
	}
	m := load(t, e, tiny(t))
	generate(t, m, 1, prompt(1, 5), 3)
}
