// Package redisaffinity keeps what several balancer replicas must share in
// Redis: session → backend assignments ([Store], a
// balancer.AffinityStore), so every replica routes a session to the
// instance holding its KV cache, and finished responses ([ResponseCache]),
// so an instance can serve what another generated.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "10.0.0.5:6379"})
//	store, _ := redisaffinity.New(rdb, redisaffinity.WithPrefix("prod:"))
//	lb, _ := balancer.New(balancer.WithAffinityStore(store, 30*time.Minute))
//
// Every call takes the caller's context and fails with the client's error
// while Redis is unreachable; the balancer then decides locally. The
// client belongs to the caller, who closes it.
package redisaffinity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mlxserving/mlxserving/balancer"
)

// DefaultPrefix starts every key unless WithPrefix says otherwise.
const DefaultPrefix = "mlxserving:"

// Option configures a Store or a ResponseCache.
type Option func(*config) error

type config struct {
	prefix   string
	maxValue int
	timeout  time.Duration
}

// WithPrefix starts every key with p (for several deployments on one
// Redis). It must not be empty; the default is DefaultPrefix.
func WithPrefix(p string) Option {
	return func(c *config) error {
		if p == "" {
			return errors.New("key prefix is empty")
		}
		c.prefix = p
		return nil
	}
}

// WithTimeout bounds each call on top of its context, so an unreachable
// Redis costs a routing decision at most d. It must be positive; the
// default is 200ms.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("timeout %v: must be positive", d)
		}
		c.timeout = d
		return nil
	}
}

// WithMaxValueBytes bounds the values a ResponseCache stores; Set refuses
// larger ones with a *ValueTooLargeError. It must be positive; the
// default is DefaultMaxValue.
func WithMaxValueBytes(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("max value bytes %d: must be positive", n)
		}
		c.maxValue = n
		return nil
	}
}

// DefaultMaxValue is the largest value a ResponseCache stores unless
// WithMaxValueBytes says otherwise.
const DefaultMaxValue = 1 << 20

func newConfig(rdb redis.UniversalClient, opts []Option) (config, error) {
	c := config{prefix: DefaultPrefix, maxValue: DefaultMaxValue, timeout: 200 * time.Millisecond}
	if rdb == nil {
		return c, errors.New("redisaffinity: client is nil")
	}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&c); err != nil {
			return c, fmt.Errorf("redisaffinity: %w", err)
		}
	}
	return c, nil
}

// Store is a balancer.AffinityStore in Redis: one key per session,
// holding the backend's name, expiring after the TTL Set is given.
type Store struct {
	rdb redis.UniversalClient
	cfg config
}

var _ balancer.AffinityStore = (*Store)(nil)

// New returns a Store over rdb. Keys are the prefix, "affinity:" and the
// session key.
func New(rdb redis.UniversalClient, opts ...Option) (*Store, error) {
	cfg, err := newConfig(rdb, opts)
	if err != nil {
		return nil, err
	}
	return &Store{rdb: rdb, cfg: cfg}, nil
}

func (s *Store) key(k string) string { return s.cfg.prefix + "affinity:" + k }

// Get returns the backend assigned to key, "" when none is.
func (s *Store) Get(ctx context.Context, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	v, err := s.rdb.Get(ctx, s.key(key)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("redisaffinity: get %q: %w", key, err)
	}
	return v, nil
}

// Set assigns key to backend for ttl (at least a millisecond), refreshing
// the entry.
func (s *Store) Set(ctx context.Context, key, backend string, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("redisaffinity: set %q: ttl %v: must be at least 1ms", key, ttl)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	if err := s.rdb.Set(ctx, s.key(key), backend, ttl).Err(); err != nil {
		return fmt.Errorf("redisaffinity: set %q: %w", key, err)
	}
	return nil
}

// Delete drops key's assignment.
func (s *Store) Delete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	if err := s.rdb.Del(ctx, s.key(key)).Err(); err != nil {
		return fmt.Errorf("redisaffinity: delete %q: %w", key, err)
	}
	return nil
}

// ValueTooLargeError is a value larger than the cache's bound.
type ValueTooLargeError struct {
	Key       string
	Size, Max int
}

func (e *ValueTooLargeError) Error() string {
	return fmt.Sprintf("redisaffinity: value for %q is %d bytes, above the %d-byte bound", e.Key, e.Size, e.Max)
}

// ResponseCache keeps byte values (finished responses) in Redis with a
// TTL, bounded in size, under the prefix and "response:".
type ResponseCache struct {
	rdb redis.UniversalClient
	cfg config
}

// NewResponseCache returns a ResponseCache over rdb.
func NewResponseCache(rdb redis.UniversalClient, opts ...Option) (*ResponseCache, error) {
	cfg, err := newConfig(rdb, opts)
	if err != nil {
		return nil, err
	}
	return &ResponseCache{rdb: rdb, cfg: cfg}, nil
}

func (c *ResponseCache) key(k string) string { return c.cfg.prefix + "response:" + k }

// Get returns the value under key; ok is false when there is none (or it
// expired).
func (c *ResponseCache) Get(ctx context.Context, key string) (value []byte, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	v, err := c.rdb.Get(ctx, c.key(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("redisaffinity: cache get %q: %w", key, err)
	}
	return v, true, nil
}

// Set stores value under key for ttl (at least a millisecond). A value
// above the bound is refused with a *ValueTooLargeError.
func (c *ResponseCache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if len(value) > c.cfg.maxValue {
		return &ValueTooLargeError{Key: key, Size: len(value), Max: c.cfg.maxValue}
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("redisaffinity: cache set %q: ttl %v: must be at least 1ms", key, ttl)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	if err := c.rdb.Set(ctx, c.key(key), value, ttl).Err(); err != nil {
		return fmt.Errorf("redisaffinity: cache set %q: %w", key, err)
	}
	return nil
}
