package enginetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// promptOverflow checks that Open refuses a prompt one token longer than
// m's context with a *engine.ContextLengthError.
func (s *suite) promptOverflow(tb testing.TB, m engine.Model) {
	tb.Helper()
	info := m.Info()
	id := s.id()
	_, err := m.Open(s.ctx, id, promptTokens(80, info.ContextLength+1, info.VocabSize), "")
	var cle *engine.ContextLengthError
	switch {
	case err == nil:
		m.Free(id, "")
		tb.Errorf("model %q: a %d-token prompt opened with ContextLength %d", info.ID, info.ContextLength+1, info.ContextLength)
	case !errors.As(err, &cle):
		tb.Errorf("model %q: a prompt over the context: %v; want a *engine.ContextLengthError", info.ID, err)
	case cle.Limit != info.ContextLength:
		tb.Errorf("model %q: ContextLengthError.Limit %d, want %d", info.ID, cle.Limit, info.ContextLength)
	}
}

// checkCapacity: prompts over the context are refused with a
// *engine.ContextLengthError; opening more tokens than KVCapacity fails
// with engine.ErrOutOfMemory, and works again once a sequence is freed.
// A paged model takes its KV as sequences are fed, not at Open: its
// capacity is checked by checkBlocks.
func checkCapacity(tb testing.TB, s *suite) {
	s.promptOverflow(tb, s.small)
	if s.info.ContextLength <= 1<<17 {
		s.promptOverflow(tb, s.m)
	}
	info := s.small.Info()
	if info.Paged() {
		checkBlocks(tb, s)
		return
	}
	if info.BlockSize != 0 || info.KVBlocks != 0 {
		tb.Errorf("Info.BlockSize %d and KVBlocks %d: a paged model sets both, another neither", info.BlockSize, info.KVBlocks)
	}
	plen := max(1, min(info.ContextLength, info.KVCapacity)*3/4)
	var open []engine.SeqID
	defer func() {
		for _, id := range open {
			s.small.Free(id, "")
		}
	}()
	var oom error
	for total := 0; total <= info.KVCapacity; total += plen {
		id := s.id()
		_, err := s.small.Open(s.ctx, id, promptTokens(int(id), plen, info.VocabSize), "")
		if err != nil {
			oom = err
			break
		}
		open = append(open, id)
	}
	switch {
	case oom == nil:
		tb.Fatalf("opened %d sequences of %d tokens with KVCapacity %d", len(open), plen, info.KVCapacity)
	case !errors.Is(oom, engine.ErrOutOfMemory):
		tb.Fatalf("opening past KVCapacity %d: %v; want engine.ErrOutOfMemory", info.KVCapacity, oom)
	case len(open) == 0:
		tb.Fatalf("the first %d-token sequence did not fit KVCapacity %d: %v", plen, info.KVCapacity, oom)
	}
	s.small.Free(open[0], "")
	open = open[1:]
	id := s.id()
	if _, err := s.small.Open(s.ctx, id, promptTokens(int(id), plen, info.VocabSize), ""); err != nil {
		tb.Fatalf("opening after a Free released %d tokens: %v", plen, err)
	}
	open = append(open, id)
}

// checkMaxBatch: a Step with more inputs than MaxBatch is refused with an
// error, not a crash, and the model works afterwards.
func checkMaxBatch(tb testing.TB, s *suite) {
	info := s.small.Info()
	params := &engine.SamplingParams{}
	var batch []engine.StepInput
	for range info.MaxBatch + 1 {
		id := s.id()
		p := promptTokens(int(id), 4, info.VocabSize)
		if _, err := s.small.Open(s.ctx, id, p, ""); err != nil {
			tb.Fatalf("open: %v", err)
		}
		defer s.small.Free(id, "")
		batch = append(batch, engine.StepInput{Seq: id, Tokens: p, Sample: true, Params: params})
	}
	if err := safeStep(s.ctx, s.small, batch); err == nil {
		tb.Errorf("a Step of %d inputs ran with MaxBatch %d", len(batch), info.MaxBatch)
	} else if errors.Is(err, errPanic) {
		tb.Error(err)
	}
	for _, in := range batch {
		s.small.Free(in.Seq, "")
	}
	s.alone(tb, s.small, promptTokens(81, 6, info.VocabSize), 6, nil)
}

// errPanic marks a Step that panicked.
var errPanic = errors.New("step panicked")

// safeStep runs m.Step, turning a panic into an error.
func safeStep(ctx context.Context, m engine.Model, batch []engine.StepInput) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errPanic, r)
		}
	}()
	_, err = m.Step(ctx, batch)
	return err
}

// checkCancellation: a Step under a cancelled context returns an error
// wrapping context.Canceled promptly, and once its sequences are freed
// the model gives the same tokens as before.
func checkCancellation(tb testing.TB, s *suite) {
	p := s.prompt(90, 12)
	want := s.alone(tb, s.m, p, 8, nil)
	ctx, cancel := context.WithCancel(s.ctx)
	cancel()
	params := &engine.SamplingParams{}
	var batch []engine.StepInput
	for i := range 2 {
		id := s.id()
		q := s.prompt(91+i, 10)
		if _, err := s.m.Open(s.ctx, id, q, ""); err != nil {
			tb.Fatalf("open: %v", err)
		}
		defer s.m.Free(id, "")
		batch = append(batch, engine.StepInput{Seq: id, Tokens: q, Sample: true, Params: params})
	}
	start := time.Now()
	err := safeStep(ctx, s.m, batch)
	if took := time.Since(start); took > 5*time.Second {
		tb.Errorf("Step under a cancelled context took %v", took)
	}
	if !errors.Is(err, context.Canceled) {
		tb.Errorf("Step under a cancelled context: %v; want an error wrapping context.Canceled", err)
	}
	for _, in := range batch {
		s.m.Free(in.Seq, "")
	}
	if got := s.alone(tb, s.m, p, 8, nil); !slices.Equal(got, want) {
		tb.Errorf("after a cancelled step: %v; before: %v", got, want)
	}
}

// checkClose: after Close, Open and Step return engine.ErrClosed, Free
// and Info do not fail, and Close again is fine.
func checkClose(tb testing.TB, s *suite) {
	m := s.small
	info := m.Info()
	id := s.id()
	p := promptTokens(95, 4, info.VocabSize)
	if _, err := m.Open(s.ctx, id, p, ""); err != nil {
		tb.Fatalf("open: %v", err)
	}
	if err := m.Close(); err != nil {
		tb.Fatalf("Close: %v", err)
	}
	if _, err := m.Open(s.ctx, s.id(), p, ""); !errors.Is(err, engine.ErrClosed) {
		tb.Errorf("Open after Close: %v; want engine.ErrClosed", err)
	}
	in := []engine.StepInput{{Seq: id, Tokens: p, Sample: true, Params: &engine.SamplingParams{}}}
	if err := safeStep(s.ctx, m, in); !errors.Is(err, engine.ErrClosed) {
		tb.Errorf("Step after Close: %v; want engine.ErrClosed", err)
	}
	m.Free(id, "")
	if got := m.Info(); got.ID != info.ID {
		tb.Errorf("Info after Close: ID %q, want %q", got.ID, info.ID)
	}
	if err := m.Close(); err != nil {
		tb.Errorf("second Close: %v", err)
	}
}
