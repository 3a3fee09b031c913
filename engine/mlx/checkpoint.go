package mlx

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
)

// tensorInfo is one entry of a safetensors header.
type tensorInfo struct {
	File  string
	DType string
	Shape []int
}

var dtypeBytes = map[string]int{"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "I64": 8, "U8": 1, "I8": 1, "BOOL": 1, "F64": 8, "U16": 2, "I16": 2, "U64": 8}

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
	bad := func(reason string) error { return &engine.CheckpointError{Path: path, Reason: reason} }
	f, err := os.Open(path)
	if err != nil {
		return nil, bad(err.Error())
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, bad(err.Error())
	}
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		return nil, bad("corrupt safetensors: file too short for a header")
	}
	if n == 0 || n > 100<<20 || int64(n)+8 > st.Size() {
		return nil, bad(fmt.Sprintf("corrupt safetensors: header length %d does not fit a %d-byte file", n, st.Size()))
	}
	hb := make([]byte, n)
	if _, err := io.ReadFull(f, hb); err != nil {
		return nil, bad("corrupt safetensors: " + err.Error())
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hb, &raw); err != nil {
		return nil, bad("corrupt safetensors header: " + err.Error())
	}
	return checkEntries(path, raw, st.Size()-8-int64(n))
}

func checkEntries(path string, raw map[string]json.RawMessage, dataLen int64) (map[string]tensorInfo, error) {
	out := make(map[string]tensorInfo, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			continue
		}
		bad := func(reason string) error { return &engine.CheckpointError{Path: path, Tensor: name, Reason: reason} }
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int   `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, bad("corrupt header entry: " + err.Error())
		}
		size, ok := dtypeBytes[e.DType]
		if !ok {
			return nil, bad(fmt.Sprintf("unsupported dtype %q", e.DType))
		}
		want := int64(size)
		for _, d := range e.Shape {
			if d < 0 {
				return nil, bad("negative dimension")
			}
			want *= int64(d)
		}
		if len(e.Offsets) != 2 || e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > dataLen {
			return nil, bad(fmt.Sprintf("data offsets %v outside the %d data bytes (truncated file?)", e.Offsets, dataLen))
		}
		if e.Offsets[1]-e.Offsets[0] != want {
			return nil, bad(fmt.Sprintf("holds %d bytes; shape %v of %s needs %d", e.Offsets[1]-e.Offsets[0], e.Shape, e.DType, want))
		}
		out[name] = tensorInfo{File: path, DType: e.DType, Shape: e.Shape}
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
