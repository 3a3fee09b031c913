// Package retry is the one place the serving stack decides whether, when
// and how often to try again, when to stop sending work to a backend that
// keeps failing, and when a request has waited too long.
//
// It has four parts:
//
//   - [Policy]: exponential backoff with jitter (on
//     github.com/cenkalti/backoff/v4), a cap on attempts and on elapsed
//     time, and a server's Retry-After honoured when an error carries one.
//     [Policy.Do] runs a function under the policy; [Policy.Start] returns
//     a [Tracker] for loops that own their waiting (the batcher, a worker
//     supervisor).
//   - Classification: [Classify] gives an error its one [Class] (a [Kind]
//     and an error code), from which every layer decides: whether to try
//     again ([Class.Retryable], [Retryable]), whether it counts against a
//     backend's breaker ([Class.CountsAsFailure]), whether a balancer
//     fails over ([Class.FailsOver]), the error code the API and the
//     transports send ([Class.Code]; the HTTP layer maps the class to a
//     status: openai.Status) and the metrics outcome ([Class.Outcome]). Lost workers, refused or reset connections, an
//     open breaker of one backend among several and refusals for load
//     that carry a Retry-After are retried; bad input, an exceeded
//     context, a caller's cancellation, a fired deadline and any failure
//     after a token reached the caller ([InterruptedError]) are not.
//     Packages retry cannot import name their errors' codes with
//     [NewError] or an ErrorCode method ([Coder]).
//   - [Breaker]: a circuit breaker per worker or backend on
//     github.com/sony/gobreaker, in the two-step shape streams need
//     (success or failure is known only at the end).
//   - [Deadlines] and [DeadlineError]: time to first token, the longest
//     gap between tokens (stall) and the total time, enforced by a
//     [Watch] that cancels the request with an error naming the deadline
//     that fired.
//
// The package imports nothing of the project but engine/ errors and api/
// (where the Deadlines type lives), and no HTTP, so every layer (engines,
// the batcher, the server, a load balancer) can use it without linking
// net/http (TestNoHTTP checks that for the layers below the HTTP API).
//
// Use:
//
//	p, _ := retry.NewPolicy(retry.WithMaxAttempts(3))
//	err := p.Do(ctx, func(ctx context.Context) error {
//		return backend.Call(ctx)
//	})
package retry
