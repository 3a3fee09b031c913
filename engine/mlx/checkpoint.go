package mlx

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/safetensors"
)

// tensorInfo is one entry of a safetensors header.
type tensorInfo struct {
	File  string
	DType string
	Shape []int
}

// weightFiles lists the checkpoint's safetensors files: those named by
// model.safetensors.index.json when present, else every *.safetensors.
func weightFiles(dir string) ([]string, error) {
	index := filepath.Join(dir, "model.safetensors.index.json")
	b, err := os.ReadFile(index)
	if err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil || len(idx.WeightMap) == 0 {
			return nil, &engine.CheckpointError{Path: index, Reason: "invalid index: want a non-empty weight_map"}
		}
		seen := map[string]bool{}
		var files []string
		for _, f := range idx.WeightMap {
			if !seen[f] {
				if strings.Contains(f, "/") || strings.Contains(f, `\`) || f == ".." {
					return nil, &engine.CheckpointError{Path: index, Reason: fmt.Sprintf("shard %q is outside the checkpoint", f)}
				}
				seen[f] = true
				files = append(files, filepath.Join(dir, f))
			}
		}
		sort.Strings(files)
		return files, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, &engine.CheckpointError{Path: index, Reason: err.Error()}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(files) == 0 {
		return nil, &engine.CheckpointError{Path: dir, Reason: "no *.safetensors weights"}
	}
	sort.Strings(files)
	return files, nil
}

// readHeader reads and checks a safetensors header against the file size, so
// that a truncated or corrupt file is refused before MLX reads it.
func readHeader(path string) (map[string]tensorInfo, error) {
	h, err := safetensors.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := make(map[string]tensorInfo, len(h.Tensors))
	for name, t := range h.Tensors {
		out[name] = tensorInfo{File: path, DType: t.DType, Shape: t.Shape}
	}
	return out, nil
}

// manifest reads every weight file's header into one name → tensor map.
func manifest(dir string) (map[string]tensorInfo, []string, error) {
	files, err := weightFiles(dir)
	if err != nil {
		return nil, nil, err
	}
	all := map[string]tensorInfo{}
	for _, f := range files {
		h, err := readHeader(f)
		if err != nil {
			return nil, nil, err
		}
		for k, v := range h {
			if prev, dup := all[k]; dup {
				return nil, nil, &engine.CheckpointError{Path: f, Tensor: k, Reason: "also in " + filepath.Base(prev.File)}
			}
			all[k] = v
		}
	}
	return all, files, nil
}
