package mlx

import (
	"fmt"
	"log/slog"
)

// Option configures New. Options are checked in New, which returns an error
// for a bad value.
type Option func(*options) error

type options struct {
	maxBatch    int
	prefixSlots int
	device      string
	memoryLimit uint64
	cacheLimit  uint64
	wiredLimit  uint64
	setMemory   bool
	setCache    bool
	setWired    bool
	logger      *slog.Logger
	kvFraction  float64
	fused       bool
	// keepWindows keeps every row of sliding layers in one group of every
	// layer, as the pool did before it had sliding groups: the reference
	// tests compare the two.
	keepWindows bool
}

func defaultOptions() options {
	return options{maxBatch: 16, prefixSlots: 64, logger: slog.New(slog.DiscardHandler), kvFraction: 0.5, fused: true}
}

func (o *options) apply(opts []Option) error {
	for _, opt := range opts {
		if opt == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := opt(o); err != nil {
			return err
		}
	}
	return nil
}

// WithMaxBatch sets the batch size a model gets when its ModelSpec leaves
// MaxBatch zero. The default is 16; n must be 1 to 1024.
func WithMaxBatch(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 1024 {
			return fmt.Errorf("mlx: WithMaxBatch(%d): want 1 to 1024", n)
		}
		o.maxBatch = n
		return nil
	}
}

// WithPrefixSlots caps how many saved KV prefixes (Free with a save key)
// each model keeps; the least recently used go first. The default is 64;
// 0 turns prefix reuse off.
func WithPrefixSlots(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return fmt.Errorf("mlx: WithPrefixSlots(%d): want 0 or more", n)
		}
		o.prefixSlots = n
		return nil
	}
}

// WithDevice picks MLX's device: "cpu" or "gpu" (Metal on Apple silicon,
// CUDA where MLX was built with it). The default is MLX's default device.
func WithDevice(name string) Option {
	return func(o *options) error {
		if name != "cpu" && name != "gpu" {
			return fmt.Errorf("mlx: WithDevice(%q): want cpu or gpu", name)
		}
		o.device = name
		return nil
	}
}

// WithFusedKernels turns the fused decode-layer kernels of a CUDA GPU on
// (the default) or off: off, a decode step runs the MLX operations they
// replace, so one program can measure both ways (see the package doc).
// Elsewhere there are none and it changes nothing.
func WithFusedKernels(on bool) Option {
	return func(o *options) error {
		o.fused = on
		return nil
	}
}

// WithMemoryLimit sets MLX's memory limit in bytes (process-wide). KV
// capacities are sized from it. It must be positive.
func WithMemoryLimit(bytes uint64) Option {
	return func(o *options) error {
		if bytes == 0 {
			return fmt.Errorf("mlx: WithMemoryLimit(0): want a positive size")
		}
		o.memoryLimit, o.setMemory = bytes, true
		return nil
	}
}

// WithCacheLimit caps MLX's buffer cache in bytes (process-wide); 0 turns
// the cache off.
func WithCacheLimit(bytes uint64) Option {
	return func(o *options) error {
		o.cacheLimit, o.setCache = bytes, true
		return nil
	}
}

// WithWiredLimit sets MLX's wired memory limit in bytes (process-wide;
// Apple GPUs only).
func WithWiredLimit(bytes uint64) Option {
	return func(o *options) error {
		o.wiredLimit, o.setWired = bytes, true
		return nil
	}
}

// WithKVFraction sets the share of MLX's memory limit, after the weights,
// that a model's KV cache may take when its ModelSpec leaves KVCapacity
// zero. The default is 0.5; f must be in (0, 1].
func WithKVFraction(f float64) Option {
	return func(o *options) error {
		if !(f > 0 && f <= 1) {
			return fmt.Errorf("mlx: WithKVFraction(%v): want (0, 1]", f)
		}
		o.kvFraction = f
		return nil
	}
}

// WithLogger sets the logger for loads and unloads. The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("mlx: WithLogger(nil)")
		}
		o.logger = l
		return nil
	}
}
