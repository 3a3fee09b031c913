package enginetest

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// checkWarm applies to models that implement engine.Warmer: Warm returns
// increasing batch sizes within MaxBatch's bucket, leaves the model
// giving the same tokens (its KV and sequences untouched, also with a
// sequence open across it), and honours a cancelled context.
func checkWarm(tb testing.TB, s *suite) {
	w, ok := s.m.(engine.Warmer)
	if !ok {
		tb.Skip("the model does not implement engine.Warmer")
	}
	p := s.prompt(40, 12)
	before := s.alone(tb, s.m, p, 8, nil)
	open := &plan{id: s.id(), prompt: s.prompt(41, 9), n: 6}
	if _, err := s.m.Open(s.ctx, open.id, open.prompt, ""); err != nil {
		tb.Fatal(err)
	}
	defer s.m.Free(open.id, "")
	sizes, err := w.Warm(s.ctx)
	if err != nil {
		tb.Fatalf("Warm: %v", err)
	}
	if len(sizes) == 0 || !slices.IsSorted(sizes) || sizes[0] < 1 {
		tb.Errorf("Warm warmed batch sizes %v: want increasing sizes from 1", sizes)
	}
	if after := s.alone(tb, s.m, p, 8, nil); !slices.Equal(before, after) {
		tb.Errorf("tokens changed across Warm: %v, then %v", before, after)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.Warm(ctx); !errors.Is(err, context.Canceled) {
		tb.Errorf("Warm with a cancelled context: %v, want context.Canceled", err)
	}
}
