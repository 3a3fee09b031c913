package prewarm_test

import (
	"context"
	"errors"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
)

// fixedHost loads every model as 1000 bytes of weights.
type fixedHost struct{}

func (fixedHost) Load(_ context.Context, spec engine.ModelSpec) (engine.Info, error) {
	return engine.Info{ID: spec.ID, WeightBytes: 1000}, nil
}
func (fixedHost) Unload(context.Context, string, bool) error { return nil }
func (fixedHost) Busy(string) bool                           { return false }

// TestReserve: what Reserve charges a model counts at once when it is
// loaded (evicting an idle model to fit), at its next load when it is
// not, and fails with a BudgetError when nothing can make room.
func TestReserve(t *testing.T) {
	g, err := prewarm.NewManager(fixedHost{}, prewarm.WithBudget(2500))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if err := g.Register(prewarm.Model{Spec: engine.ModelSpec{ID: id, Path: "/" + id}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Reserve(ctx, "nobody", 1); !errors.Is(err, prewarm.ErrUnknownModel) {
		t.Fatalf("Reserve of an unknown model: %v", err)
	}
	if err := g.Reserve(ctx, "a", -1); err == nil {
		t.Fatal("Reserve of negative bytes accepted")
	}
	used := func(want int64, when string) {
		t.Helper()
		if got, _ := g.Memory(); got != want {
			t.Fatalf("%s: %d bytes used, want %d", when, got, want)
		}
	}
	if err := g.Reserve(ctx, "a", 200); err != nil { // not loaded: charged at its load
		t.Fatal(err)
	}
	used(0, "nothing loaded")
	for _, id := range []string{"a", "b"} {
		if err := g.Acquire(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
		g.Idle(id)
	}
	used(2200, "a with its reservation, b")
	if err := g.Reserve(ctx, "b", 600); err != nil { // 2800 > 2500: a, idle, goes
		t.Fatal(err)
	}
	used(1600, "b with its reservation, a evicted")
	if err := g.Reserve(ctx, "b", 1600); err == nil { // 1000 + 1600 fits no budget of 2500
		t.Fatal("a reservation past the budget accepted")
	} else if be := (*prewarm.BudgetError)(nil); !errors.As(err, &be) {
		t.Fatalf("a reservation past the budget: %v, want a *BudgetError", err)
	}
	used(1600, "after the refused reservation")
}
