//go:build !mlx

package mlx

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// ErrNoMLX is returned by New in a build without the mlx tag. It wraps
// engine.ErrUnavailable.
var ErrNoMLX = fmt.Errorf("mlx: built without mlx: rebuild with -tags mlx and CGO_CFLAGS/CGO_LDFLAGS pointing at MLX and mlx-c (see the package doc): %w", engine.ErrUnavailable)

// Engine is the MLX engine. In this build (without the mlx tag) it cannot
// be constructed: New returns ErrNoMLX.
type Engine struct{}

// New checks the options and returns ErrNoMLX: this build has no MLX.
func New(opts ...Option) (*Engine, error) {
	o := defaultOptions()
	if err := o.apply(opts); err != nil {
		return nil, err
	}
	return nil, ErrNoMLX
}

// Name returns "mlx".
func (*Engine) Name() string { return "mlx" }

// Load returns ErrNoMLX.
func (*Engine) Load(context.Context, engine.ModelSpec) (engine.Model, error) { return nil, ErrNoMLX }

// Close does nothing.
func (*Engine) Close() error { return nil }
