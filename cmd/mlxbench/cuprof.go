//go:build mlx

package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// profilerCall calls CUDA's driver entry point name (cuProfilerStart or
// cuProfilerStop) when libcuda is loaded in this process, with device 0's
// primary context current on the calling thread (MLX's own thread holds
// it, not this one); it returns -1 where libcuda is not loaded (the CPU
// build), else the driver's result.
static int profilerCall(const char *name) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) return -1;
	int (*retain)(void **, int) = (int (*)(void **, int))dlsym(h, "cuDevicePrimaryCtxRetain");
	int (*push)(void *) = (int (*)(void *))dlsym(h, "cuCtxPushCurrent_v2");
	int (*pop)(void **) = (int (*)(void **))dlsym(h, "cuCtxPopCurrent_v2");
	int (*f)(void) = (int (*)(void))dlsym(h, name);
	void *ctx = 0, *old = 0;
	int rc = -1;
	if (retain && push && pop && f && retain(&ctx, 0) == 0 && push(ctx) == 0) {
		rc = f();
		pop(&old);
	}
	dlclose(h);
	return rc;
}
*/
import "C"

import (
	"log"
	"unsafe"
)

// gpuProfiler brackets the timed decode steps for a kernel profiler
// started with its collection off (ncu --profile-from-start off), so a
// profile holds those steps' kernels and none of loading, warming or
// prefill. Without libcuda in the process (the CPU build) it does
// nothing.
type gpuProfiler bool

func (p gpuProfiler) start() { p.call("cuProfilerStart") }
func (p gpuProfiler) stop()  { p.call("cuProfilerStop") }

func (p gpuProfiler) call(name string) {
	if !p {
		return
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	if rc := C.profilerCall(cs); rc != 0 {
		log.Printf("mlxbench: %s: %d (no CUDA driver loaded, or the profiler refused)", name, int(rc))
	}
}
