// Package balancer routes LLM requests over several serving instances:
// local Servers, remote OpenAI-compatible instances (balancer/httpbackend)
// and instances found over NATS (balancer/natsbackend). A [LoadBalancer] is a
// [Backend] itself, so balancers nest and a program can swap a Server for
// a balancer without changing its code.
//
// A [Strategy] picks among the healthy backends that serve the model
// ([RoundRobin], [LeastLoaded], [PeakEWMA], [PowerOfTwo],
// [SessionAffinity], [PrefixAware], [Weighted]); a request refused before
// its first token fails over to another backend, one broken after tokens
// resumes on another, each backend has a circuit breaker and an optional
// active health check, and sessions can share their home backend across
// balancer replicas through an [AffinityStore] (balancer/redisaffinity).
// A request that finds no backend for its model because every one that
// served it has left waits a moment for one to be added
// ([WithBackendWait], 2 s) instead of failing: a NATS discovery drops an
// instance whose connection moves to another node and adds it back at its
// next answer.
//
// Routing never calls a backend nor waits on a lock shared with other
// requests: strategies see an immutable snapshot of the backends' load
// reports, rebuilt every refresh interval ([WithLoadRefresh]), when
// backends are added or removed and, for a [LoadReporter] (a remote
// backend), as each report arrives, beside the balancer's own live counts
// of requests in flight; a session's home comes from a local copy of the
// affinity store's ([WithAffinityRefresh]).
//
// Use:
//
//	lb, err := balancer.New(balancer.WithStrategy(balancer.PowerOfTwo(nil)))
//	_ = lb.Add("a", srvA)
//	_ = lb.Add("b", srvB)
//	st, err := lb.Generate(ctx, api.Request{Model: "llama", Prompt: "Hello", Params: api.Params{MaxTokens: 32}})
//	defer lb.Close()
//
// The priority queue each Server runs per model is package scheduler; the
// balancer imports it for the queue's errors, never the reverse.
package balancer
