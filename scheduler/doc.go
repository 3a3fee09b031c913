// Package scheduler decides which waiting request a model's batcher runs
// next, and refuses work early when it cannot be served in time.
//
// A [PriorityScheduler] queues entries in five tiers (Critical, High,
// Normal, Low, Background), each with a queue-wait SLA. Inside a tier the
// shortest job runs first; an entry close to its deadline is promoted
// ahead of its tier, and waiting raises an entry's tier over time (aging),
// so nothing starves. The queue is bounded by requests and by queued
// tokens and rejects at once with a *QueueFullError carrying RetryAfter;
// per-client token buckets reject with a *RateLimitError. A batcher pops
// whenever it has room, passing a callback that says whether the most
// urgent entry fits now; when a critical entry does not fit, Preempts
// tells it which running work it may evict and Requeue puts that back.
// [CheckFits] refuses, before queueing, requests that could never run.
//
// Use:
//
//	q, err := scheduler.New[*Job](scheduler.WithMaxQueued(1000), scheduler.WithPreemption(true))
//	err = q.Push(&scheduler.Entry[*Job]{Value: job, Tier: api.High, Client: "team-a", Cost: 512})
//	<-q.Ready()
//	next, blocked := q.Pop(func(j *Job) bool { return j.Tokens() <= free })
//	if next == nil && blocked != nil && q.Preempts(blocked.Tier, running.Tier) { evict(running); q.Requeue(running) }
//
// The design follows the peers': vLLM's priority policy (strict order by
// priority then arrival, preemption by recompute), TGI's token-budgeted
// queue and Ollama's fail-fast bounded queue; it adds SLA deadlines,
// shortest job first and aging.
//
// # Load balancing
//
// A [LoadBalancer] routes requests over [Backend]s — local Servers, remote
// OpenAI-compatible instances (scheduler/httpbackend), instances found
// over NATS (scheduler/natsbackend) — and is a Backend itself, so
// balancers nest. A [Strategy] picks among the healthy backends that serve
// the model ([RoundRobin], [LeastLoaded], [PeakEWMA], [PowerOfTwo],
// [SessionAffinity], [PrefixAware], [Weighted]); a request refused before
// its first token fails over to another backend, each backend has a
// circuit breaker, and sessions can share their home backend across
// balancer replicas through an [AffinityStore] (scheduler/redisaffinity).
//
//	lb, err := scheduler.NewLoadBalancer(scheduler.WithStrategy(scheduler.PowerOfTwo(nil)))
//	_ = lb.Add("a", srvA)
//	_ = lb.Add("b", srvB)
//	st, err := lb.Generate(ctx, api.Request{Model: "llama", Prompt: "Hello", Params: api.Params{MaxTokens: 32}})
package scheduler
