package mlxserving

import (
	"strings"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/session"
)

// WithSessionOptions configures the Server's session registry: TTL and
// the bound on sessions (session.WithTTL, session.WithMaxSessions). A
// session that leaves the registry has its saved KV dropped.
func WithSessionOptions(opts ...session.Option) Option {
	return func(c *config) error {
		c.sessionOpts = append(c.sessionOpts, opts...) // nil ones are skipped by session.New
		return nil
	}
}

// WithPrefixCacheOptions configures each model's automatic prefix cache
// (session.WithTokenBudget, session.WithBlockSize).
func WithPrefixCacheOptions(opts ...session.CacheOption) Option {
	return func(c *config) error {
		c.cacheOpts = append(c.cacheOpts, opts...) // nil ones are skipped by session.NewPrefixCache
		return nil
	}
}

// WithoutPrefixCache turns automatic prefix caching off: only a request
// naming a session reuses KV, and only its own session's.
func WithoutPrefixCache() Option {
	return func(c *config) error {
		c.noPrefixCache = true
		return nil
	}
}

// SessionStats returns the session registry's counters.
func (s *Server) SessionStats() session.Stats { return s.sessions.Stats() }

// Session returns the live session id.
func (s *Server) Session(id string) (session.Session, bool) { return s.sessions.Get(id) }

// newRegistry builds the session registry; a session that leaves drops
// its saved KV.
func (s *Server) newRegistry() (*session.Registry, error) {
	opts := append([]session.Option{session.WithOnEvict(s.dropSession)}, s.cfg.sessionOpts...)
	return session.New(opts...)
}

// dropSession drops the saved KV of a session that left the registry.
func (s *Server) dropSession(sess session.Session, _ session.Reason) {
	s.mu.RLock()
	m := s.models[sess.Model]
	s.mu.RUnlock()
	if m != nil && m.cache != nil {
		m.cache.Drop(session.Key(sess.ID))
	}
}

// lostKey makes the registry forget a session whose saved KV the engine
// evicted or lost with a worker; its next request starts afresh.
func (s *Server) lostKey(key string) {
	if id, ok := strings.CutPrefix(key, session.Key("")); ok {
		s.sessions.Forget(id)
	}
}

// savedKey records which worker holds a session's saved KV.
func (s *Server) savedKey(key string, worker int) {
	if id, ok := strings.CutPrefix(key, session.Key("")); ok && worker >= 0 {
		s.sessions.SetWorker(id, worker)
	}
}

// sessionKeys sets the keys a sequence reuses and saves its KV under:
// its session's, or with no session a fresh key that later prompts
// sharing its prefix find through the prefix cache.
func (s *Server) sessionKeys(m *model, seq *batcher.Sequence, id string) {
	switch {
	case id != "":
		key := session.Key(id)
		seq.PrefixKey, seq.SaveKey = key, key
	case m.cache != nil:
		seq.SaveKey = m.cache.NewKey()
	}
}

// prefixStats returns the model's prefix-cache counters.
func (m *model) prefixStats() session.CacheStats {
	if m.cache == nil {
		return session.CacheStats{}
	}
	return m.cache.Stats()
}
