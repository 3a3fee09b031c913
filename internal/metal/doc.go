// Package metal exposes MLX's device information and memory controls:
// active, peak and cache memory, and the memory, cache and wired limits.
// The engine and resource-aware admission read it to size KV caches and to
// refuse work that would not fit.
//
// Use:
//
//	mem, err := metal.ReadMemory()
//	if errors.Is(err, metal.ErrUnavailable) {
//		// built without -tags mlx
//	}
//	prev, err := metal.SetCacheLimit(256 << 20)
//	fmt.Println(mem.Active, mem.Peak, mem.Cache, prev)
//
// The functions need MLX and mlx-c: build with -tags mlx and cgo flags that
// point at them (see package engine/mlx). Without the tag every function
// returns an error wrapping ErrUnavailable. MLX's limits are process-wide;
// the functions are safe for concurrent use.
package metal

import (
	"errors"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// ErrUnavailable is returned by every function of a build without the mlx
// tag. It wraps engine.ErrUnavailable.
var ErrUnavailable = fmt.Errorf("metal: built without mlx: rebuild with -tags mlx and CGO_CFLAGS/CGO_LDFLAGS pointing at MLX and mlx-c: %w", engine.ErrUnavailable)

// ErrMLX wraps every error MLX itself reports; the message is MLX's.
var ErrMLX = errors.New("mlx error")

// Memory is a snapshot of MLX's allocator, in bytes.
type Memory struct {
	// Active is memory held by live arrays.
	Active uint64
	// Peak is the highest Active since start or the last ResetPeakMemory.
	Peak uint64
	// Cache is memory freed by arrays and kept for reuse.
	Cache uint64
}

// Device describes MLX's default device.
type Device struct {
	// Type is "cpu" or "gpu".
	Type string
	// Index is the device's index among devices of its type.
	Index int
	// Props holds what MLX reports about the device (for a GPU:
	// "device_name", "architecture", "memory_size", ...). Sizes are
	// formatted in decimal. Empty for the CPU backend.
	Props map[string]string
}
