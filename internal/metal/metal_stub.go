//go:build !mlx

package metal

// Init does nothing in a build without the mlx tag.
func Init() {}

// ReadMemory returns ErrUnavailable: this build has no MLX.
func ReadMemory() (Memory, error) { return Memory{}, ErrUnavailable }

// ResetPeakMemory returns ErrUnavailable: this build has no MLX.
func ResetPeakMemory() error { return ErrUnavailable }

// ClearCache returns ErrUnavailable: this build has no MLX.
func ClearCache() error { return ErrUnavailable }

// MemoryLimit returns ErrUnavailable: this build has no MLX.
func MemoryLimit() (uint64, error) { return 0, ErrUnavailable }

// SetMemoryLimit returns ErrUnavailable: this build has no MLX.
func SetMemoryLimit(uint64) (uint64, error) { return 0, ErrUnavailable }

// SetCacheLimit returns ErrUnavailable: this build has no MLX.
func SetCacheLimit(uint64) (uint64, error) { return 0, ErrUnavailable }

// SetWiredLimit returns ErrUnavailable: this build has no MLX.
func SetWiredLimit(uint64) (uint64, error) { return 0, ErrUnavailable }

// DefaultDevice returns ErrUnavailable: this build has no MLX.
func DefaultDevice() (Device, error) { return Device{}, ErrUnavailable }
