package enginetest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// Model ids and the sizes the suite asks of its second, small model.
const (
	mainID       = "conformance"
	smallID      = "conformance-small"
	smallBatch   = 2
	smallKV      = 64
	smallContext = 32
	// minContext is the context the suite's longest sequence needs.
	minContext = 64
)

// Run runs the conformance suite against eng, loading the checkpoint in
// dir (a Hugging Face-layout directory; the simulated engine accepts "" or
// any dir).
//
// It loads two models — one as the checkpoint comes, one with a small
// MaxBatch, KVCapacity and ContextLength — failing at once if either load
// fails, and checks, each in a named subtest that -run can pick: load, greedy_determinism, batch_invariance, join_leave,
// chunked_prefill, free_reuse, prefix_reuse, partial_prefix_reuse,
// seeded_sampling, resume (models reporting engine.Info.Resumes), jump_forward
// (models reporting engine.Info.JumpForward), constraints (allowed-token masks, logit bias, top
// log-probabilities and their refusals), capacity, max_batch,
// cancellation, warm (models
// implementing engine.Warmer) and close. Prompts are token ids below
// min(VocabSize, 200); generations are 6 to 16 tokens, so a tiny model
// runs the whole suite in seconds. Run closes the models it loaded but
// not eng.
func Run(t *testing.T, eng engine.Engine, dir string) {
	t.Helper()
	runChecks(t, eng, dir, nil, []namedCheck{
		{"load", checkLoad},
		{"greedy_determinism", checkDeterminism},
		{"batch_invariance", checkBatchInvariance},
		{"join_leave", checkJoinLeave},
		{"chunked_prefill", checkChunkedPrefill},
		{"free_reuse", checkFreeReuse},
		{"prefix_reuse", checkPrefixReuse},
		{"partial_prefix_reuse", checkPartialPrefixReuse},
		{"seeded_sampling", checkSeededSampling},
		{"resume", checkResume},
		{"jump_forward", checkJumpForward},
		{"constraints", checkConstraints},
		{"capacity", checkCapacity},
		{"max_batch", checkMaxBatch},
		{"cancellation", checkCancellation},
		{"warm", checkWarm},
		{"close", checkClose},
	})
}

// namedCheck is one check of a suite, run in a subtest of its name.
type namedCheck struct {
	name  string
	check func(testing.TB, *suite)
}

// runChecks loads the suite's two models from dir, failing t at once if
// either load fails, runs each check in a subtest, and closes the models.
// skip, when not nil, says why the suite does not apply to the models
// loaded ("" when it does): t is then skipped.
func runChecks(t *testing.T, eng engine.Engine, dir string, skip func(*suite) string, checks []namedCheck) {
	t.Helper()
	s, err := loadModels(context.Background(), eng, dir)
	if err != nil {
		t.Fatalf("enginetest: %v", err)
	}
	defer func() {
		if err := s.m.Close(); err != nil {
			t.Errorf("closing model %q: %v", mainID, err)
		}
		_ = s.small.Close()
	}()
	if skip != nil {
		if why := skip(s); why != "" {
			t.Skip(why)
		}
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.check(t, s) })
	}
}

// suite is what the checks share: the models and a source of fresh
// sequence ids.
type suite struct {
	ctx   context.Context
	m     engine.Model // as the checkpoint comes
	small engine.Model // small MaxBatch, KVCapacity and ContextLength
	info  engine.Info
	next  engine.SeqID
}

// id returns a sequence id no check has used.
func (s *suite) id() engine.SeqID {
	s.next++
	return s.next
}

// prompt returns n deterministic prompt tokens for the main model.
func (s *suite) prompt(seed, n int) []int32 { return promptTokens(seed, n, s.info.VocabSize) }

// alone generates n tokens for prompt on its own, fed whole, failing tb
// on any error.
func (s *suite) alone(tb testing.TB, m engine.Model, prompt []int32, n int, params *engine.SamplingParams) []int32 {
	tb.Helper()
	p := &plan{id: s.id(), prompt: prompt, n: n, params: params}
	if err := drive(s.ctx, m, []*plan{p}); err != nil {
		tb.Fatalf("generating %d tokens alone for a %d-token prompt: %v", n, len(prompt), err)
	}
	return p.out
}

// run drives plans together, failing tb on any error.
func (s *suite) run(tb testing.TB, m engine.Model, plans ...*plan) {
	tb.Helper()
	if err := drive(s.ctx, m, plans); err != nil {
		tb.Fatalf("driving %d sequences: %v", len(plans), err)
	}
}

// sameAsAlone fails tb for every plan whose tokens differ from its prompt
// generated alone.
func (s *suite) sameAsAlone(tb testing.TB, what string, plans ...*plan) {
	tb.Helper()
	for _, p := range plans {
		want := s.alone(tb, s.m, p.prompt, p.n, p.params)
		if !slices.Equal(p.out, want) {
			tb.Errorf("%s: sequence %d (%d-token prompt) got %v; alone it gets %v", what, p.id, len(p.prompt), p.out, want)
		}
	}
}

// smallSpec is the second model's spec: small limits to run into.
func smallSpec(dir string) engine.ModelSpec {
	return engine.ModelSpec{ID: smallID, Path: dir, MaxBatch: smallBatch, KVCapacity: smallKV, ContextLength: smallContext}
}

// loadModels loads the suite's two models from dir.
func loadModels(ctx context.Context, eng engine.Engine, dir string) (*suite, error) {
	m, err := eng.Load(ctx, engine.ModelSpec{ID: mainID, Path: dir})
	if err != nil {
		return nil, fmt.Errorf("Load(%q): %w", dir, err)
	}
	small, err := eng.Load(ctx, smallSpec(dir))
	if err != nil {
		_ = m.Close()
		return nil, fmt.Errorf("Load(%+v): %w", smallSpec(dir), err)
	}
	return &suite{ctx: ctx, m: m, small: small, info: m.Info()}, nil
}

// checkLoad: both models describe themselves sanely, and the small one
// honours its spec's overrides.
func checkLoad(tb testing.TB, s *suite) {
	info, si, spec := s.m.Info(), s.small.Info(), smallSpec("")
	checkInfo(tb, info, mainID)
	checkInfo(tb, si, smallID)
	if info.ContextLength < minContext {
		tb.Errorf("ContextLength %d: the suite needs a model of at least %d", info.ContextLength, minContext)
	}
	if si.MaxBatch > spec.MaxBatch {
		tb.Errorf("ModelSpec.MaxBatch %d not honoured: Info.MaxBatch %d", spec.MaxBatch, si.MaxBatch)
	}
	if si.KVCapacity > spec.KVCapacity {
		tb.Errorf("ModelSpec.KVCapacity %d not honoured: Info.KVCapacity %d", spec.KVCapacity, si.KVCapacity)
	}
	if want := min(spec.ContextLength, info.ContextLength); si.ContextLength != want {
		tb.Errorf("ModelSpec.ContextLength %d not honoured: Info.ContextLength %d, want %d", spec.ContextLength, si.ContextLength, want)
	}
	if si.VocabSize != info.VocabSize {
		tb.Errorf("the same checkpoint loaded twice: VocabSize %d and %d", info.VocabSize, si.VocabSize)
	}
}

// checkInfo checks that Info describes a usable model.
func checkInfo(tb testing.TB, info engine.Info, id string) {
	tb.Helper()
	if info.ID != id {
		tb.Errorf("Info.ID %q, want %q", info.ID, id)
	}
	if info.Engine == "" {
		tb.Error("Info.Engine is empty")
	}
	for name, v := range map[string]int{"ContextLength": info.ContextLength, "VocabSize": info.VocabSize,
		"KVCapacity": info.KVCapacity, "MaxBatch": info.MaxBatch} {
		if v < 1 {
			tb.Errorf("Info.%s %d, want at least 1", name, v)
		}
	}
	for _, id := range info.EOS {
		if id < 0 || int(id) >= info.VocabSize {
			tb.Errorf("Info.EOS holds %d, outside the vocabulary [0, %d)", id, info.VocabSize)
		}
	}
}
