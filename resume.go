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
// would have ended are refused. eos are the model's end ids.
func resumeSequence(seq *batcher.Sequence, resume []int32, eos []int32) error {
	if len(resume) == 0 {
		return nil
	}
	bad := func(i int, why string) error {
		return &engine.InvalidParamError{Param: "resume", Reason: fmt.Sprintf("token %d (position %d) %s", resume[i], i, why)}
	}
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
	seq.Prompt = append(slices.Clip(seq.Prompt), resume...)
	seq.MaxTokens -= len(resume)
	seq.Params.Generated += len(resume)
	return nil
}
