//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"runtime"

	"github.com/mlxserving/mlxserving/internal/metal"
)

// worker runs every MLX call of an engine on one goroutine locked to its OS
// thread, so MLX's per-thread state and the error handler's per-thread
// message stay with the calls that produced them.
type worker struct {
	jobs   chan func(*graph)
	done   chan struct{}
	stream C.mlx_stream
}

// startWorker starts the thread and picks the stream of device ("" for
// MLX's default device); fused asks for the fused decode-layer kernels
// where the stream runs on a CUDA GPU.
func startWorker(device string, fused bool) (*worker, error) {
	w := &worker{jobs: make(chan func(*graph)), done: make(chan struct{})}
	errc := make(chan error, 1)
	go w.loop(device, fused, errc)
	if err := <-errc; err != nil {
		<-w.done
		return nil, err
	}
	return w, nil
}

func (w *worker) loop(device string, fused bool, errc chan<- error) {
	// The goroutine stays locked until it exits, so the thread ends with it.
	runtime.LockOSThread()
	defer close(w.done)
	metal.Init()
	dev := C.mlx_device_new()
	defer C.mlx_device_free(dev)
	var rc C.int
	switch device {
	case "":
		rc = C.mlx_get_default_device(&dev)
	case "cpu":
		C.mlx_device_free(dev)
		dev = C.mlx_device_new_type(C.MLX_CPU, 0)
	case "gpu":
		C.mlx_device_free(dev)
		dev = C.mlx_device_new_type(C.MLX_GPU, 0)
	}
	if rc != 0 {
		errc <- errMLX("default device", rc)
		return
	}
	var avail C.bool
	if rc := C.mlx_device_is_available(&avail, dev); rc != 0 || !avail {
		errc <- errMLX("device "+device+" is not available", 1)
		return
	}
	w.stream = C.mlx_stream_new()
	defer C.mlx_stream_free(w.stream)
	if rc := C.mlx_get_default_stream(&w.stream, dev); rc != 0 {
		errc <- errMLX("default stream", rc)
		return
	}
	k, err := compileKernels(w.stream, fused)
	if err != nil {
		errc <- err
		return
	}
	defer k.free()
	errc <- nil
	g := &graph{s: w.stream, k: k}
	for job := range w.jobs {
		job(g)
		g.release()
		g.err = nil
	}
}

// do runs job on the thread and waits for it. The graph's temporaries are
// freed after job returns; job reads results out before that.
func (w *worker) do(job func(*graph)) {
	done := make(chan struct{})
	w.jobs <- func(g *graph) {
		defer close(done)
		job(g)
	}
	<-done
}

// stop ends the thread once queued jobs are done.
func (w *worker) stop() {
	close(w.jobs)
	<-w.done
}
