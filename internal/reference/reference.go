// Package reference runs reference.py, a plain float64 forward pass of
// every model family the engines serve (no KV cache, no packing, each
// family's rules spelled out as transformers has them), so the engines'
// tests can compare their greedy tokens and log-probabilities with it.
//
//	runs, err := reference.Greedy(ctx, "/usr/bin/python3", dir, prompts, 6)
package reference

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os/exec"
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
	in, err := json.Marshal(map[string]any{"prompts": prompts, "n": n})
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, python, "-c", script, dir)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("reference.py: %w\n%s", err, stderr.String())
	}
	var runs []Run
	if err := json.Unmarshal(raw, &runs); err != nil {
		return nil, fmt.Errorf("reference.py output: %w", err)
	}
	if len(runs) != len(prompts) {
		return nil, fmt.Errorf("reference.py: %d runs for %d prompts", len(runs), len(prompts))
	}
	return runs, nil
}
