// Package session keeps conversations on the KV that already holds them.
//
// A [Registry] maps session ids to their affinity — the model, the worker
// and the instance that hold the session's saved KV — with a time-to-live
// and a bound on the number of sessions. Sessions are created implicitly by
// the first request that names one; ids come from the caller (checked by
// [ValidateID]) or are minted with [NewID]. When a session leaves (expired,
// pushed out by the bound, removed) the registry's eviction callback tells
// the engine to drop the session's saved KV.
//
// A [PrefixCache] wraps a loaded model (an engine.Model) and makes prefix
// caching automatic, with or without a session: it keeps an [Index] of the
// token blocks each saved KV entry holds, so a request without a session
// still reuses the best saved prefix — the system prompt many users share
// — and the engine reuses the longest common prefix of that entry and the
// new prompt. The saved KV is bounded by a token budget, evicted least
// recently used first, and kept consistent with what the engine itself
// evicts or loses (engine.SavedKV).
//
// Use:
//
//	reg, err := session.New(session.WithTTL(30*time.Minute), session.WithMaxSessions(10000),
//		session.WithOnEvict(func(s session.Session, _ session.Reason) { cache.Drop(session.Key(s.ID)) }))
//	defer reg.Close()
//	s, created, err := reg.Begin(id, "llama") // id "" mints one
//	cache, err := session.NewPrefixCache(model) // hand cache to the batcher as its engine.Model
package session
