package mlxserving

import (
	"fmt"
	"slices"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
)

// resumeSequence makes seq continue a generation whose first tokens an
// earlier attempt delivered (api.Params.Resume): they follow the prompt,
// count as generated for the engine's sampling
// (engine.SamplingParams.Generated) and for MaxTokens, and are fed to the
// sequence's stop strings, detokenizer and constraint first, so the
// stream carries on from them. Tokens after which the earlier attempt
// would have ended are refused. eos are the model's end ids. With jump
// set (the batcher appends forced tokens), the jump-forward runs of the
// earlier attempt are replayed, and the rest of the one it stopped inside
// becomes seq.Forced.
func resumeSequence(seq *batcher.Sequence, resume []int32, eos []int32, jump bool) error {
	if len(resume) == 0 {
		return nil
	}
	bad := func(i int, why string) error {
		return &engine.InvalidParamError{Param: "resume", Reason: fmt.Sprintf("token %d (position %d) %s", resume[i], i, why)}
	}
	var run []int32 // the forced tokens the earlier attempt appended next
	for i, tok := range resume {
		if slices.Contains(seq.StopTokens, tok) || (!seq.IgnoreEOS && slices.Contains(eos, tok)) {
			return bad(i, "ends generation")
		}
		if seq.Constraint != nil {
			if seq.Constraint.Done() {
				return bad(i, "follows a complete JSON document")
			}
			if err := seq.Constraint.Accept(tok); err != nil {
				return &engine.InvalidParamError{Param: "resume", Reason: fmt.Sprintf("position %d: %v", i, err), Err: err}
			}
			run = replayForced(seq, run, tok, i, jump)
		}
		if seq.Text != nil {
			if _, stopped := seq.Text.Add(tok); stopped {
				return bad(i, "completes a stop string")
			}
		}
	}
	if seq.Constraint != nil && seq.Constraint.Done() {
		return &engine.InvalidParamError{Param: "resume", Reason: "the tokens complete the JSON document: nothing is left to generate"}
	}
	seq.Forced = run
	seq.Prompt = append(slices.Clip(seq.Prompt), resume...)
	seq.MaxTokens -= len(resume)
	seq.Params.Generated += len(resume)
	return nil
}

// replayForced follows the earlier attempt's jump-forward decoding over
// resume token tok at position i, just accepted by seq's constraint: run
// holds the forced tokens it appended after its last sample. A token that
// is run's next was forced; any other was sampled, and the batcher then
// asked for the tokens forced after it (batcher.WithJumpForward, bounded
// by what MaxTokens left). It returns the forced tokens still to come.
func replayForced(seq *batcher.Sequence, run []int32, tok int32, i int, jump bool) []int32 {
	f, ok := seq.Constraint.(batcher.Forcer)
	if !jump || !ok || seq.Params.Logprobs || seq.Params.TopLogprobs > 0 {
		return nil
	}
	if len(run) > 0 && run[0] == tok {
		return run[1:]
	}
	if room := seq.MaxTokens - (i + 1); room > 0 {
		return f.ForcedTokens(room)
	}
	return nil
}
