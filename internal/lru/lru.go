// Package lru is a least-recently-used map bounded by the total weight of
// its entries (bytes, tokens, or nothing), with an optional time to live
// enforced on use. It is the module's one LRU: the response cache of
// merge/, the saved-KV budget and the session table of session/, the
// loaded models of prewarm/, the rate-limit buckets of scheduler/, the
// session homes and prefix index of balancer/, the grammar caches of
// engine/grammar and the simulated engine's saved prefixes keep their
// entries in one.
//
// An LRU starts no goroutine: every Add, Get, Peek, Oldest, Len, Weight
// and Keys first drops the entries past their TTL, so an expired entry is
// never returned and never holds weight a live one needs. It is not safe for concurrent
// use; its owners hold a lock of their own around it.
//
//	l := lru.New[string, []byte](1<<20, time.Minute, nil)
//	l.Add("k", b, int64(len(b)))
//	b, ok := l.Get("k")
package lru

import (
	"container/list"
	"time"
)

// LRU is a weight-bounded least-recently-used map. Build one with New.
type LRU[K comparable, V any] struct {
	max     int64
	ttl     time.Duration
	onEvict func(K, V)
	now     func() time.Time

	items  map[K]*list.Element // of *entry
	recent *list.List          // of *entry, least recently used first
	byAge  *list.List          // of *entry, oldest Add first: expiry order
	weight int64
}

type entry[K comparable, V any] struct {
	key     K
	val     V
	weight  int64
	expires time.Time
	age     *list.Element // in byAge; nil without a TTL
}

// New returns an empty LRU. maxWeight bounds the total weight: 0 (or
// less) is unbounded. ttl is how long an entry lives after its Add: 0
// (or less) never expires. onEvict, if not nil, is called with every
// entry the LRU drops by itself (over the weight bound, expired, Purge),
// not with those Remove takes out.
func New[K comparable, V any](maxWeight int64, ttl time.Duration, onEvict func(K, V)) *LRU[K, V] {
	return &LRU[K, V]{max: maxWeight, ttl: ttl, onEvict: onEvict, now: time.Now,
		items: map[K]*list.Element{}, recent: list.New(), byAge: list.New()}
}

// SetClock replaces time.Now, for tests that step time. An LRU without a
// TTL never reads its clock.
func (l *LRU[K, V]) SetClock(now func() time.Time) { l.now = now }

// Add stores v under k with the given weight as the most recently used
// entry, replacing (without an eviction) what k held and restarting its
// TTL, then drops the least recently used entries until the weight bound
// holds: k itself last, when its weight alone exceeds the bound.
func (l *LRU[K, V]) Add(k K, v V, weight int64) {
	var now time.Time
	if l.ttl > 0 {
		now = l.now()
		l.expire(now)
	}
	if el, ok := l.items[k]; ok {
		l.unlink(el)
	}
	e := &entry[K, V]{key: k, val: v, weight: weight}
	if l.ttl > 0 {
		e.expires = now.Add(l.ttl)
		e.age = l.byAge.PushBack(e)
	}
	l.items[k] = l.recent.PushBack(e)
	l.weight += weight
	for l.max > 0 && l.weight > l.max {
		l.evict(l.recent.Front())
	}
}

// Get returns the live value under k and marks it most recently used.
func (l *LRU[K, V]) Get(k K) (V, bool) {
	v, ok := l.Peek(k)
	if ok {
		l.recent.MoveToBack(l.items[k])
	}
	return v, ok
}

// Peek returns the live value under k without marking it used.
func (l *LRU[K, V]) Peek(k K) (V, bool) {
	l.expireNow()
	el, ok := l.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	return el.Value.(*entry[K, V]).val, true
}

// Oldest returns the least recently used live entry without marking it
// used; ok is false when the LRU is empty.
func (l *LRU[K, V]) Oldest() (k K, v V, ok bool) {
	l.expireNow()
	el := l.recent.Front()
	if el == nil {
		return k, v, false
	}
	e := el.Value.(*entry[K, V])
	return e.key, e.val, true
}

// Contains reports whether k holds a live value, without marking it used.
func (l *LRU[K, V]) Contains(k K) bool {
	el, ok := l.items[k]
	return ok && (l.byAge.Len() == 0 || !l.expired(el.Value.(*entry[K, V]), l.now())) // no clock read without a TTL
}

// Remove takes k out, without calling onEvict, and returns what it held.
func (l *LRU[K, V]) Remove(k K) (V, bool) {
	el, ok := l.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	l.unlink(el)
	return el.Value.(*entry[K, V]).val, true
}

// Keys returns the live keys, least recently used first.
func (l *LRU[K, V]) Keys() []K {
	l.expireNow()
	keys := make([]K, 0, len(l.items))
	for el := l.recent.Front(); el != nil; el = el.Next() {
		keys = append(keys, el.Value.(*entry[K, V]).key)
	}
	return keys
}

// Len returns the number of live entries.
func (l *LRU[K, V]) Len() int {
	l.expireNow()
	return len(l.items)
}

// Weight returns the total weight of the live entries.
func (l *LRU[K, V]) Weight() int64 {
	l.expireNow()
	return l.weight
}

// Purge drops every entry, calling onEvict for each.
func (l *LRU[K, V]) Purge() {
	for el := l.recent.Front(); el != nil; el = l.recent.Front() {
		l.evict(el)
	}
}

// expireNow is expire at the clock's time; while no entry has a TTL it
// reads no clock.
func (l *LRU[K, V]) expireNow() {
	if l.byAge.Len() > 0 {
		l.expire(l.now())
	}
}

// expire drops the entries whose TTL has passed at now. Amortised O(1):
// each entry leaves byAge once.
func (l *LRU[K, V]) expire(now time.Time) {
	for a := l.byAge.Front(); a != nil; a = l.byAge.Front() {
		e := a.Value.(*entry[K, V])
		if !l.expired(e, now) {
			return
		}
		l.evict(l.items[e.key])
	}
}

func (l *LRU[K, V]) expired(e *entry[K, V], now time.Time) bool {
	return e.age != nil && !now.Before(e.expires)
}

// evict drops el and tells onEvict.
func (l *LRU[K, V]) evict(el *list.Element) {
	l.unlink(el)
	if l.onEvict != nil {
		e := el.Value.(*entry[K, V])
		l.onEvict(e.key, e.val)
	}
}

// unlink takes el out of every index.
func (l *LRU[K, V]) unlink(el *list.Element) {
	e := el.Value.(*entry[K, V])
	l.recent.Remove(el)
	if e.age != nil {
		l.byAge.Remove(e.age)
	}
	delete(l.items, e.key)
	l.weight -= e.weight
}
