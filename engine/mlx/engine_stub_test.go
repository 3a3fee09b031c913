//go:build !mlx

package mlx

import (
	"context"
	"errors"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

func TestUnavailableWithoutTag(t *testing.T) {
	e, err := New()
	if e != nil || !errors.Is(err, engine.ErrUnavailable) || !errors.Is(err, ErrNoMLX) {
		t.Fatalf("New() = %v, %v; want nil and ErrUnavailable", e, err)
	}
	if _, err := New(WithMaxBatch(-1)); err == nil || errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("bad option: err = %v, want an option error", err)
	}
	var stub *Engine
	if _, err := stub.Load(context.Background(), engine.ModelSpec{ID: "x", Path: "y"}); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Load: %v", err)
	}
}
