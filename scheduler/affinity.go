package scheduler

import (
	"context"
	"time"
)

// AffinityStore keeps session → backend assignments where several
// balancer replicas can share them (scheduler/redisaffinity keeps them in
// Redis), so every replica routes a session to the instance that holds
// its KV cache. Errors mean the store is unreachable: the balancer then
// decides locally and logs a warning.
type AffinityStore interface {
	// Get returns the backend assigned to key, or "" when none is.
	Get(ctx context.Context, key string) (backend string, err error)
	// Set assigns key to backend for ttl, refreshing the entry.
	Set(ctx context.Context, key, backend string, ttl time.Duration) error
}

// Registry is what discovery (scheduler/natsbackend) needs of a balancer:
// backends come and go as instances announce themselves and stop.
type Registry interface {
	// Add starts routing to b under name; a second Add of the same name
	// replaces the backend.
	Add(name string, b Backend) error
	// Remove stops routing new requests to name; requests in flight
	// finish.
	Remove(name string)
}
