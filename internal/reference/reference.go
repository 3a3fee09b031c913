// Package reference runs reference.py, a plain float64 forward pass of
// every model family the engines serve (no KV cache, no packing, each
// family's rules spelled out as transformers has them), so the engines'
// tests can compare their greedy tokens and log-probabilities with it.
// Quantized checkpoints (FP8 with block or per-channel scales, AWQ, GPTQ
// with or without act order, v1 or v2 zeros, compressed-tensors int4
// symmetric or not; see testmodel.AllQuants) are dequantized from the
// file's bytes first, so the reference is the float model the quantized
// file stands for.
//
//	runs, err := reference.Greedy(ctx, "/usr/bin/python3", dir, prompts, 6)
//	vecs, err := reference.Embed(ctx, "/usr/bin/python3", dir, inputs, engine.PoolMean)
package reference

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os/exec"

	"github.com/mlxserving/mlxserving/engine"
)

//go:embed reference.py
var script string

// Run is one prompt's greedy continuation under the reference.
type Run struct {
	// Tokens are the greedy tokens after the prompt.
	Tokens []int32
	// Logprobs are each chosen token's log-probability.
	Logprobs []float64
	// Gaps are the differences between the two largest log-probabilities
	// at each step: near zero, either token is a right answer.
	Gaps []float64
}

// Weights returns the named weights (model.-relative names, as
// "model.layers.0.mlp.down_proj.weight") flattened, as the reference's
// forward pass uses them: dequantized to float64 when the checkpoint in
// dir is quantized.
func Weights(ctx context.Context, python, dir string, names []string) (map[string][]float64, error) {
	var out map[string][]float64
	if err := call(ctx, python, dir, map[string]any{"weights": names}, &out); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("reference.py: no weight %s", n)
		}
	}
	return out, nil
}

// Greedy runs the reference with python (an interpreter with torch) on
// the checkpoint in dir: n greedy tokens after each prompt.
func Greedy(ctx context.Context, python, dir string, prompts [][]int32, n int) ([]Run, error) {
	var runs []Run
	if err := call(ctx, python, dir, map[string]any{"prompts": prompts, "n": n}, &runs); err != nil {
		return nil, err
	}
	if len(runs) != len(prompts) {
		return nil, fmt.Errorf("reference.py: %d runs for %d prompts", len(runs), len(prompts))
	}
	return runs, nil
}

// Embed runs the reference on the checkpoint in dir (a decoder or an
// encoder, bert or modernbert): each input's pooled vector, the model's
// last hidden state after its final norm pooled with pool, not
// normalized — what engine.StepOutput.Embedding holds.
func Embed(ctx context.Context, python, dir string, inputs [][]int32, pool engine.Pooling) ([][]float64, error) {
	switch pool {
	case engine.PoolMean, engine.PoolCLS, engine.PoolLast:
	default:
		return nil, fmt.Errorf("reference: pooling %v", pool)
	}
	var vecs [][]float64
	if err := call(ctx, python, dir, map[string]any{"embed": inputs, "pool": pool.String()}, &vecs); err != nil {
		return nil, err
	}
	if len(vecs) != len(inputs) {
		return nil, fmt.Errorf("reference.py: %d vectors for %d inputs", len(vecs), len(inputs))
	}
	return vecs, nil
}

// call runs reference.py on dir with req on stdin and decodes its output
// into out.
func call(ctx context.Context, python, dir string, req, out any) error {
	in, err := json.Marshal(req)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, python, "-c", script, dir)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("reference.py: %w\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("reference.py output: %w", err)
	}
	return nil
}
