package scheduler_test

import (
	"errors"
	"fmt"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/scheduler"
)

// A batcher with room for two sequences pops the most urgent work first;
// inside a tier the shortest job runs first.
func Example() {
	q, err := scheduler.New[string](scheduler.WithMaxQueued(100), scheduler.WithPreemption(true))
	if err != nil {
		panic(err)
	}
	for _, e := range []*scheduler.Entry[string]{
		{Value: "nightly report", Tier: api.Background, Cost: 4000},
		{Value: "chat reply", Tier: api.Normal, Cost: 300},
		{Value: "short chat reply", Tier: api.Normal, Cost: 80},
		{Value: "health probe", Tier: api.Critical, Cost: 16},
	} {
		if err := q.Push(e); err != nil {
			panic(err)
		}
	}
	room := 2
	for {
		next, blocked := q.Pop(func(string) bool { return room > 0 })
		if next == nil {
			fmt.Printf("batch full; %q waits (preempts background: %v)\n", blocked.Value, q.Preempts(blocked.Tier, api.Background))
			break
		}
		room--
		fmt.Printf("run %s (%s, cost %d)\n", next.Value, next.Tier, next.Cost)
	}
	// Output:
	// run health probe (critical, cost 16)
	// run short chat reply (normal, cost 80)
	// batch full; "chat reply" waits (preempts background: false)
}

// A full queue answers at once with how long to wait.
func ExampleQueueFullError() {
	q, _ := scheduler.New[int](scheduler.WithMaxQueued(1), scheduler.WithHeadroom(0))
	_ = q.Push(&scheduler.Entry[int]{Value: 1, Cost: 10})
	err := q.Push(&scheduler.Entry[int]{Value: 2, Cost: 10})
	var full *scheduler.QueueFullError
	if errors.As(err, &full) {
		fmt.Println(full.Queued, full.MaxQueued, full.RetryAfter)
	}
	fmt.Println(err)
	// Output:
	// 1 1 1m0s
	// queue full: 1 requests queued (limit 1 for normal), retry after 1m0s
}

// CheckFits refuses what could never run, before it is queued.
func ExampleCheckFits() {
	fmt.Println(scheduler.CheckFits("llama-3-8b", 7000, 2000, 8192, 65536))
	fmt.Println(scheduler.CheckFits("llama-3-8b", 3000, 1000, 8192, 2048))
	// Output:
	// context length exceeded: model "llama-3-8b" holds 8192 tokens; the request needs 9000 (7000 prompt + 2000 to generate)
	// out of memory: model "llama-3-8b" holds 2048 tokens of KV cache in all; the request needs 4000 (3000 prompt + 1000 to generate)
}
