// Package merge lets identical deterministic requests share one
// generation, and serves finished ones again from a response cache.
//
// A [Merger] sits between a server's entry points and its scheduler and
// sees requests and streams only. Each request is named by a [Key]: a hash
// of the model, the model's revision (what its checkpoint answers with: the
// engine and a fingerprint of the files, so reloading the same checkpoint
// keeps it and a changed checkpoint gets a new one), the prompt tokens and
// every parameter that shapes the output. Only deterministic requests —
// greedy, or sampled with a seed — may be merged or cached
// ([Deterministic]); the caller decides eligibility and Join never sees
// the others.
//
//   - Coalescing: a request whose key matches a generation in flight
//     subscribes to it. A late subscriber first receives every chunk
//     produced so far, then the live ones. Each subscriber has its own
//     cancellation; the generation stops when the last one leaves. The
//     generation runs at the most urgent tier among its subscribers: a
//     more urgent subscriber raises it while it is still queued.
//   - Response cache: a finished generation one of whose subscribers
//     opted in is kept in an LRU bounded by bytes and by age (the
//     module's internal/lru); a later request with
//     the same key replays it as a normal stream. Expiry needs no
//     goroutine: each look-up or store first drops the responses past
//     their TTL, so an expired response is never served and its bytes go
//     back to the bound.
//   - Shared cache ([WithSharedCache]): behind the local cache, a store
//     several instances share (Redis: balancer/redisaffinity's
//     ResponseCache). A finished response is stored there too, and a
//     local miss looks there before generating, so an answer one instance
//     computed is a hit on every instance serving the same checkpoint. An
//     unreachable store only costs the look-up (bounded at 200 ms).
//
// Join reports which of the two (or neither) served a request as an
// [Outcome], which the HTTP layer returns in its X-Cache header.
//
// Use:
//
//	m, _ := merge.New(merge.WithCache(64<<20, 10*time.Minute))
//	defer m.Close()
//	src, outcome, err := m.Join(ctx, key, api.Normal, true, start)
//	stream := api.NewStream(ctx, src, api.Header{Cache: string(outcome)})
package merge
