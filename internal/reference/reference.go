// Package reference runs reference.py, a plain float64 forward pass of
// every model family the engines serve (no KV cache, no packing, each
// family's rules spelled out as transformers has them), so the engines'
// tests can compare their greedy tokens and log-probabilities with it.
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

// Greedy runs the reference with python (an interpreter with torch) on
// the checkpoint in dir: n greedy tokens after each prompt.
func Greedy(ctx context.Context, python, dir string, prompts [][]int32, n int) ([]Run, error) {
	var runs []Run
	if err := run(ctx, python, dir, map[string]any{"prompts": prompts, "n": n}, &runs); err != nil {
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
	if err := run(ctx, python, dir, map[string]any{"embed": inputs, "pool": pool.String()}, &vecs); err != nil {
		return nil, err
	}
	if len(vecs) != len(inputs) {
		return nil, fmt.Errorf("reference.py: %d vectors for %d inputs", len(vecs), len(inputs))
	}
	return vecs, nil
}

// run feeds req to reference.py and decodes its reply into out.
func run(ctx context.Context, python, dir string, req, out any) error {
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
