package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// A call that loses its worker twice succeeds on the third attempt; bad
// input is returned at once.
func ExamplePolicy_Do() {
	p, err := retry.NewPolicy(retry.WithMaxAttempts(4), retry.WithBackoff(time.Millisecond, 10*time.Millisecond, 2))
	if err != nil {
		panic(err)
	}
	attempts := 0
	err = p.Do(context.Background(), func(ctx context.Context) error {
		attempts++
		if attempts < 3 {
			return fmt.Errorf("worker 1 exited: %w", engine.ErrWorkerLost)
		}
		return nil
	})
	fmt.Println(attempts, err)

	err = p.Do(context.Background(), func(ctx context.Context) error {
		return &engine.InvalidParamError{Param: "top_p", Reason: "1.5 is out of range"}
	})
	fmt.Println(retry.Retryable(err), err)
	// Output:
	// 3 <nil>
	// false invalid parameter top_p: 1.5 is out of range
}

// A stream's outcome is known only at its end: Allow admits it, done
// reports how it went.
func ExampleBreaker() {
	b, err := retry.NewBreaker("worker-0", retry.WithTrip(2, 0, 0), retry.WithOpenTimeout(time.Minute))
	if err != nil {
		panic(err)
	}
	for range 2 {
		done, err := b.Allow()
		if err != nil {
			panic(err)
		}
		// ... the stream runs, then its worker dies ...
		done(engine.ErrWorkerLost)
	}
	_, err = b.Allow()
	fmt.Println(b.State(), errors.Is(err, retry.ErrBreakerOpen), err)
	// Output:
	// open true worker-0: circuit breaker open
}

// A Watch cancels a request whose first token does not come in time.
func ExampleNewWatch() {
	fired := make(chan error, 1)
	d := retry.Deadlines{FirstToken: 10 * time.Millisecond, Stall: time.Second}
	w := retry.NewWatch(d, time.Now(), func(e *retry.DeadlineError) { fired <- e })
	defer w.Stop()
	err := <-fired
	var de *retry.DeadlineError
	fmt.Println(errors.As(err, &de), de.Kind, err)
	// Output:
	// true time_to_first_token deadline exceeded: no first token within 10ms
}
