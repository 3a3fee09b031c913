//go:build mlx

package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// profilerCall calls CUDA's driver entry point name (cuProfilerStart or
// cuProfilerStop) when libcuda is loaded in this process; it returns -1
// where it is not (the CPU build), else the driver's result.
static int profilerCall(const char *name) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) return -1;
	int (*f)(void) = (int (*)(void))dlsym(h, name);
	int rc = f ? f() : -1;
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
