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
// The load balancer that routes requests over several servers is package
// balancer; it imports this package for the queue's errors, never the
// reverse.
package scheduler
