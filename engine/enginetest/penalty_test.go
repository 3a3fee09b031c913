package enginetest

import (
	"context"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestSimPenalties: presence and frequency penalties count generated
// tokens, not the prompt, and push a repeated token down.
func TestSimPenalties(t *testing.T) {
	_, m := newModel(t)
	ctx := context.Background()
	run := func(p *engine.SamplingParams) []int32 {
		id := engine.SeqID(len(p.LogitBias)*1000 + int(p.FrequencyPenalty*10) + 1)
		prompt := []int32{5, 6, 7, 5, 6, 7}
		if _, err := m.Open(ctx, id, prompt, ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(id, "")
		mask := make([]uint64, engine.MaskWords(m.Info().VocabSize))
		mask[0] = 1<<5 | 1<<6
		var got []int32
		feed := prompt
		for i := 0; i < 12; i++ {
			o, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: feed, Sample: true, Params: p, Allowed: mask}})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, o[0].Token)
			feed = []int32{o[0].Token}
		}
		return got
	}
	plain := run(&engine.SamplingParams{LogitBias: map[int32]float32{5: 50}})
	for _, tok := range plain {
		if tok != 5 {
			t.Fatalf("bias +50 on 5 without penalties: got %v", plain)
		}
	}
	// Each repeat of 5 costs 2 more; the bias of 50 is spent after ~25
	// repeats, so with both penalties at 2 token 6 must show up.
	pen := run(&engine.SamplingParams{LogitBias: map[int32]float32{5: 5}, FrequencyPenalty: 2, PresencePenalty: 2})
	run5 := 0
	for _, tok := range pen {
		if tok == 5 {
			run5++
		} else {
			run5 = 0
		}
		if run5 > 4 {
			t.Fatalf("frequency penalty 2 did not stop token 5 repeating: %v", pen)
		}
	}
	if pen[0] != 5 {
		t.Fatalf("the prompt counted for penalties: first token %d, want 5 (%v)", pen[0], pen)
	}
}
