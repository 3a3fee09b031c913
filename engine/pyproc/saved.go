package pyproc

import (
	"math"

	"github.com/mlxserving/mlxserving/engine"
)

// affinityLoad bounds prefix affinity: a sequence goes to the worker that
// holds the KV saved under its prefix key only while that worker carries
// at most affinityLoad times the pool's mean load (counting the new
// sequence), the bound of consistent hashing with bounded loads (Mirrokni
// et al.), and has the blocks for the prompt; otherwise it goes where a
// sequence without a key goes (pickSlot) and prefills there.
const affinityLoad = 1.25

var (
	_ engine.SavedKV       = (*Model)(nil)
	_ engine.WorkerLocator = (*Model)(nil)
)

// pickFor is the slot a sequence of n prompt tokens with prefix key goes
// to, with the breaker admission's done func as pickSlot gives it: the
// holder of the key's saved KV when its load is within the bound, its
// pool has the blocks for the prompt (roomFor: those of the saved prefix
// count as free) and its breaker admits the sequence, else what pickSlot
// picks.
func (m *Model) pickFor(key string, n int) (*slot, func(error)) {
	if key == "" {
		return m.pickSlot(n)
	}
	p, ok := m.saved[key]
	if !ok || !p.alive() {
		return m.pickSlot(n)
	}
	var holder *slot
	total := int64(1)
	for _, s := range m.e.slots {
		total += s.open.Load()
		s.mu.Lock()
		if s.cur == p {
			holder = s
		}
		s.mu.Unlock()
	}
	if holder == nil {
		return m.pickSlot(n)
	}
	bound := int64(math.Ceil(affinityLoad * float64(total) / float64(len(m.e.slots))))
	if holder.open.Load()+1 > bound || !m.roomFor(p, n) {
		m.affinityMissed++
		return m.pickSlot(n)
	}
	done, err := holder.breaker.Allow()
	if err != nil {
		return m.pickSlot(n)
	}
	m.affinityHits++
	return holder, done
}

// noteSaved records where the KV saved under key lives now: on p, saved
// by request id.
func (m *Model) noteSaved(key string, p *proc, id uint64) {
	if old, ok := m.saved[key]; ok && old != p {
		m.unnote(key)
		if old.alive() { // the same key saved on another worker: the old copy is stale
			_, _, _ = old.send(request("drop", map[string]any{"model": m.handle, "key": key}), false)
		}
	}
	m.saved[key] = p
	m.savedAt[key] = id
	keys := m.byProc[p]
	if keys == nil {
		keys = map[string]struct{}{}
		m.byProc[p] = keys
	}
	keys[key] = struct{}{}
}

// unnote forgets where key's saved KV lives.
func (m *Model) unnote(key string) {
	p, ok := m.saved[key]
	if !ok {
		return
	}
	delete(m.saved, key)
	delete(m.savedAt, key)
	delete(m.byProc[p], key)
	delete(m.savedBy, key)
}

// DropSaved discards the KV saved under key on the worker that holds it;
// see engine.SavedKV. The request is sent without waiting for its reply.
func (m *Model) DropSaved(key string) {
	p, ok := m.saved[key]
	if !ok {
		return
	}
	m.unnote(key)
	if p.alive() && !m.closed.Load() {
		_, _, _ = p.send(request("drop", map[string]any{"model": m.handle, "key": key}), false)
	}
}

// EvictedSaved returns the keys the workers evicted for memory since the
// last call, every key saved on a worker that has died since, and the
// keys saved by sequences of an adapter removed or replaced since (no
// sequence can reuse that KV: it is dropped on its worker); see
// engine.SavedKV.
func (m *Model) EvictedSaved() []string {
	m.dropGoneSaved()
	for p := range m.pools {
		m.readFrees(p)
	}
	out := m.evicted
	m.evicted = nil
	for p, keys := range m.byProc {
		if p.alive() {
			continue
		}
		for key := range keys {
			delete(m.saved, key)
			delete(m.savedAt, key)
			out = append(out, key)
		}
		delete(m.byProc, p)
	}
	return out
}

// noteEvicted takes a worker's report, in its reply to request id, of the
// saved keys it evicted. A key saved again by a later request is the new
// save's, not evicted.
func (m *Model) noteEvicted(p *proc, id uint64, keys []string) {
	for _, k := range keys {
		if m.saved[k] == p && m.savedAt[k] < id {
			m.unnote(k)
			m.evicted = append(m.evicted, k)
		}
	}
}

// AffinityStats counts how Open routed sequences that named a prefix key
// held on some worker.
type AffinityStats struct {
	// Hits went to the worker holding their prefix.
	Hits int64
	// Overloaded went elsewhere because that worker was over the load
	// bound or lacked the blocks for the prompt.
	Overloaded int64
	// Saved is the number of keys with saved KV on some worker.
	Saved int
}

// Affinity returns the routing counters. Like Open, it must not run
// concurrently with Open, Step or Free.
func (m *Model) Affinity() AffinityStats {
	return AffinityStats{Hits: m.affinityHits, Overloaded: m.affinityMissed, Saved: len(m.saved)}
}

// SavedWorker returns the index of the worker holding the KV saved under
// key, or -1 when no live worker holds it. Like Open, it must not run
// concurrently with Open, Step or Free.
func (m *Model) SavedWorker(key string) int {
	p, ok := m.saved[key]
	if !ok || !p.alive() {
		return -1
	}
	for _, s := range m.e.slots {
		s.mu.Lock()
		cur := s.cur
		s.mu.Unlock()
		if cur == p {
			return s.idx
		}
	}
	return -1
}
