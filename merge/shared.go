package merge

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// SharedCache is a response cache several instances share (Redis:
// balancer/redisaffinity.ResponseCache implements it). Values are opaque
// bytes under string keys, each kept for a TTL. An error means the store
// is unreachable: the Merger then serves from its own cache and
// generations as if it had none.
type SharedCache interface {
	Get(ctx context.Context, key string) (value []byte, ok bool, err error)
	Set(ctx context.Context, key string, value []byte, ttl time.Duration) error
}

// sharedTimeout bounds one shared-cache call, so a slow store delays a
// request by at most this much.
const sharedTimeout = 200 * time.Millisecond

// WithSharedCache backs the response cache with sc, shared across
// instances: a finished response that opted in is also stored there for
// ttl, and a request that misses the local cache looks there before it
// generates. The keys name the model's revision, so instances share
// answers only for the same checkpoint. WithCache is needed too (the local
// tier holds what the shared one returns); ttl must be positive.
func WithSharedCache(sc SharedCache, ttl time.Duration) Option {
	return func(c *config) error {
		if sc == nil || ttl <= 0 {
			return fmt.Errorf("merge: WithSharedCache: want a cache and a positive TTL")
		}
		c.shared, c.sharedTTL = sc, ttl
		return nil
	}
}

// sharedKey is k as the shared store names it.
func sharedKey(k Key) string { return "mlxserving:response:" + hex.EncodeToString(k[:]) }

// sharedGet looks k up in the shared cache; a hit is also kept locally.
func (m *Merger) sharedGet(ctx context.Context, k Key) (*response, bool) {
	ctx, cancel := context.WithTimeout(ctx, sharedTimeout)
	defer cancel()
	b, ok, err := m.shared.Get(ctx, sharedKey(k))
	if err != nil || !ok {
		if err != nil {
			m.sharedErrors.Add(1)
		}
		return nil, false
	}
	var chunks []api.Chunk
	if err := json.Unmarshal(b, &chunks); err != nil || !finished(chunks) {
		m.sharedErrors.Add(1)
		return nil, false
	}
	m.sharedHits.Add(1)
	m.cache.add(k, chunks)
	return newResponse(chunks), true
}

// sharedSet stores a finished response in the shared cache.
func (m *Merger) sharedSet(k Key, chunks []api.Chunk) {
	b, err := json.Marshal(chunks)
	if err != nil {
		m.sharedErrors.Add(1)
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, sharedTimeout)
	defer cancel()
	if err := m.shared.Set(ctx, sharedKey(k), b, m.sharedTTL); err != nil && !errors.Is(err, context.Canceled) {
		m.sharedErrors.Add(1)
	}
}

// finished reports whether chunks end with a final chunk, as a stored
// response must.
func finished(chunks []api.Chunk) bool {
	return len(chunks) > 0 && chunks[len(chunks)-1].Finish != ""
}
