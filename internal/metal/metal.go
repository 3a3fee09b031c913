//go:build mlx

package metal

/*
#cgo LDFLAGS: -lmlxc -lmlx
#include <stdlib.h>
#include "mlx/c/mlx.h"
void mlxs_init(void);
const char* mlxs_take_error(void);
*/
import "C"

import (
	"fmt"
	"runtime"
	"strconv"
)

// Init installs MLX's error handler for the process, so that MLX errors
// become Go errors instead of exiting the process. Every function of this
// package calls it; engines call it before their first MLX call. It is
// idempotent.
func Init() { C.mlxs_init() }

// takeError returns the calling OS thread's last MLX error, wrapping
// ErrMLX, and clears it; rc is the return code of the failed call. The
// caller must be locked to its OS thread since the call that failed.
func takeError(rc C.int) error {
	msg := C.mlxs_take_error()
	if msg == nil {
		return fmt.Errorf("%w: call failed with code %d", ErrMLX, int(rc))
	}
	return fmt.Errorf("%w: %s", ErrMLX, C.GoString(msg))
}

// call runs f on a locked thread and turns a non-zero return into an error.
func call(f func() C.int) error {
	Init()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := f(); rc != 0 {
		return takeError(rc)
	}
	return nil
}

func size(f func(*C.size_t) C.int) (uint64, error) {
	var v C.size_t
	err := call(func() C.int { return f(&v) })
	return uint64(v), err
}

// ReadMemory returns MLX's allocator figures.
func ReadMemory() (Memory, error) {
	var m Memory
	var err error
	if m.Active, err = size(func(v *C.size_t) C.int { return C.mlx_get_active_memory(v) }); err != nil {
		return m, err
	}
	if m.Peak, err = size(func(v *C.size_t) C.int { return C.mlx_get_peak_memory(v) }); err != nil {
		return m, err
	}
	m.Cache, err = size(func(v *C.size_t) C.int { return C.mlx_get_cache_memory(v) })
	return m, err
}

// ResetPeakMemory sets the peak to the current active memory.
func ResetPeakMemory() error {
	return call(func() C.int { return C.mlx_reset_peak_memory() })
}

// ClearCache returns the allocator's cached buffers to the system.
func ClearCache() error {
	return call(func() C.int { return C.mlx_clear_cache() })
}

// MemoryLimit returns the memory limit: allocations past it wait for
// memory to be freed (or fail).
func MemoryLimit() (uint64, error) {
	return size(func(v *C.size_t) C.int { return C.mlx_get_memory_limit(v) })
}

// SetMemoryLimit sets the memory limit in bytes and returns the previous
// one.
func SetMemoryLimit(n uint64) (prev uint64, err error) {
	return size(func(v *C.size_t) C.int { return C.mlx_set_memory_limit(v, C.size_t(n)) })
}

// SetCacheLimit caps the allocator's cache in bytes (0 disables caching)
// and returns the previous cap. MLX's CPU-only build keeps no cache and
// returns 0.
func SetCacheLimit(n uint64) (prev uint64, err error) {
	return size(func(v *C.size_t) C.int { return C.mlx_set_cache_limit(v, C.size_t(n)) })
}

// SetWiredLimit sets the wired (resident) memory limit in bytes and returns
// the previous one. Only Apple GPUs honour it; elsewhere it has no effect
// and returns 0.
func SetWiredLimit(n uint64) (prev uint64, err error) {
	return size(func(v *C.size_t) C.int { return C.mlx_set_wired_limit(v, C.size_t(n)) })
}

// DefaultDevice describes MLX's default device.
func DefaultDevice() (Device, error) {
	Init()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev := C.mlx_device_new()
	defer C.mlx_device_free(dev)
	if rc := C.mlx_get_default_device(&dev); rc != 0 {
		return Device{}, takeError(rc)
	}
	var typ C.mlx_device_type
	var idx C.int
	if rc := C.mlx_device_get_type(&typ, dev); rc != 0 {
		return Device{}, takeError(rc)
	}
	if rc := C.mlx_device_get_index(&idx, dev); rc != 0 {
		return Device{}, takeError(rc)
	}
	d := Device{Type: "cpu", Index: int(idx), Props: map[string]string{}}
	if typ == C.MLX_GPU {
		d.Type = "gpu"
	}
	return d, deviceProps(dev, d.Props)
}

func deviceProps(dev C.mlx_device, props map[string]string) error {
	info := C.mlx_device_info_new()
	defer C.mlx_device_info_free(info)
	if rc := C.mlx_device_info_get(&info, dev); rc != 0 {
		return takeError(rc)
	}
	keys := C.mlx_vector_string_new()
	defer C.mlx_vector_string_free(keys)
	if rc := C.mlx_device_info_get_keys(&keys, info); rc != 0 {
		return takeError(rc)
	}
	for i := C.size_t(0); i < C.mlx_vector_string_size(keys); i++ {
		var k *C.char
		if rc := C.mlx_vector_string_get(&k, keys, i); rc != 0 {
			return takeError(rc)
		}
		var isStr C.bool
		if rc := C.mlx_device_info_is_string(&isStr, info, k); rc != 0 {
			return takeError(rc)
		}
		if isStr {
			var s *C.char
			if C.mlx_device_info_get_string(&s, info, k) == 0 {
				props[C.GoString(k)] = C.GoString(s)
			}
			continue
		}
		var v C.size_t
		if C.mlx_device_info_get_size(&v, info, k) == 0 {
			props[C.GoString(k)] = strconv.FormatUint(uint64(v), 10)
		}
	}
	return nil
}
