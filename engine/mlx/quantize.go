//go:build mlx

package mlx

/*
#include <stdlib.h>
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"github.com/mlxserving/mlxserving/engine"
)

// Quantize writes to dst an MLX affine-quantized copy of the float
// checkpoint at src, in the layout MLX's own tools write (and this engine
// loads): every linear layer and the embedding as uint32-packed weights
// with per-group scales and biases, config.json with a "quantization"
// entry, tokenizer files copied. bits is 4 or 8; groupSize is 32, 64 or
// 128 and must divide every layer's input size. gpt_oss's stacked
// experts stay float. A checkpoint already quantized (MLX's form or a
// transformers layout, MXFP4 included) is refused.
func (e *Engine) Quantize(ctx context.Context, src, dst string, bits, groupSize int) error {
	if (bits != 4 && bits != 8) || (groupSize != 32 && groupSize != 64 && groupSize != 128) {
		return &engine.InvalidParamError{Param: "quantization", Reason: fmt.Sprintf("%d bits, group size %d: want 4 or 8 bits, group 32, 64 or 128", bits, groupSize)}
	}
	c, err := readConfig(src)
	if err != nil {
		return err
	}
	if c.Quant != nil || c.HF != nil {
		return &engine.CheckpointError{Path: src, Reason: "already quantized"}
	}
	man, files, err := manifest(src)
	if err != nil {
		return err
	}
	mods, err := planModules(c, man)
	if err != nil {
		return err
	}
	for _, m := range mods {
		if m.In != 0 && m.Experts == 0 && m.In%groupSize != 0 {
			return &engine.InvalidParamError{Param: "quantization", Reason: fmt.Sprintf("group size %d does not divide %s's input size %d", groupSize, m.Name, m.In)}
		}
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	want := map[string]bool{}
	for name := range man {
		want[name] = true
	}
	var qerr error
	err = e.run(func(g *graph) {
		ts, err := loadTensors(ctx, g, files, want)
		if err != nil {
			qerr = err
			return
		}
		defer func() {
			for _, a := range ts {
				free(&a)
			}
		}()
		qerr = saveQuantized(g, ts, mods, filepath.Join(dst, "model.safetensors"), bits, groupSize)
	})
	if err == nil {
		err = qerr
	}
	if err != nil {
		return err
	}
	return writeQuantConfig(src, dst, bits, groupSize)
}

func saveQuantized(g *graph, ts map[string]arr, mods []module, path string, bits, groupSize int) error {
	out := C.mlx_map_string_to_array_new()
	defer C.mlx_map_string_to_array_free(out)
	put := func(name string, a arr) {
		cn := C.CString(name)
		defer C.free(unsafe.Pointer(cn))
		if rc := C.mlx_map_string_to_array_insert(out, cn, a); rc != 0 && g.err == nil {
			g.err = errMLX("map insert", rc)
		}
	}
	quantized := map[string]bool{}
	for _, m := range mods {
		if m.In == 0 || m.Experts > 0 {
			continue
		}
		q, s, b := g.quantize(ts[m.Name+".weight"], groupSize, bits)
		put(m.Name+".weight", q)
		put(m.Name+".scales", s)
		put(m.Name+".biases", b)
		quantized[m.Name+".weight"] = true
	}
	for name, a := range ts {
		if !quantized[name] {
			put(name, a)
		}
	}
	if g.err != nil {
		return g.err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	meta := C.mlx_map_string_to_string_new()
	defer C.mlx_map_string_to_string_free(meta)
	cf, mlxv := C.CString("format"), C.CString("mlx")
	defer C.free(unsafe.Pointer(cf))
	defer C.free(unsafe.Pointer(mlxv))
	C.mlx_map_string_to_string_insert(meta, cf, mlxv)
	if rc := C.mlx_save_safetensors(cpath, out, meta); rc != 0 {
		return errMLX("save_safetensors", rc)
	}
	return nil
}

// writeQuantConfig copies config.json with a quantization entry, and the
// tokenizer and generation files as they are.
func writeQuantConfig(src, dst string, bits, groupSize int) error {
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	m["quantization"] = map[string]any{"group_size": groupSize, "bits": bits, "mode": "affine"}
	if b, err = json.MarshalIndent(m, "", "  "); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), b, 0o644); err != nil {
		return err
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
