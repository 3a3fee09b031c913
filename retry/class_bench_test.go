package retry_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

// BenchmarkClassify: the cost of one classification, paid on every
// refusal and failure (and, as a nil check, at every stream's end).
func BenchmarkClassify(b *testing.B) {
	for _, bc := range []struct {
		name string
		err  error
	}{
		{"nil", nil},
		{"queue-full", &scheduler.QueueFullError{RetryAfter: time.Second}},
		{"wrapped-lost", fmt.Errorf("step: %w", fmt.Errorf("worker 1: %w", engine.ErrWorkerLost))},
		{"http-429", &httpbackend.Error{Status: 429, Code: "queue_full", RetryAfter: time.Second}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if c := retry.Classify(bc.err); c.Code == "x" {
					b.Fatal(c)
				}
			}
		})
	}
}
