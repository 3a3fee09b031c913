package lru

import "sync"

// Shared is an LRU safe for concurrent use, for owners with no lock of
// their own around it: every call holds its lock for the call alone, so a
// Get followed by an Add is two steps another goroutine may come between
// (callers whose caches only memoise do not mind). Build one with
// NewShared.
type Shared[K comparable, V any] struct {
	mu sync.Mutex
	l  *LRU[K, V]
}

// NewShared returns an empty Shared LRU of at most n entries (each of
// weight 1), without a TTL or an eviction callback; n of 0 or less is
// unbounded.
func NewShared[K comparable, V any](n int) *Shared[K, V] {
	return &Shared[K, V]{l: New[K, V](int64(n), 0, nil)}
}

// Get returns the value under k and marks it most recently used.
func (s *Shared[K, V]) Get(k K) (V, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.l.Get(k)
}

// Add stores v under k as the most recently used entry, dropping the
// least recently used past the bound.
func (s *Shared[K, V]) Add(k K, v V) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.l.Add(k, v, 1)
}

// Len returns the number of entries.
func (s *Shared[K, V]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.l.Len()
}
