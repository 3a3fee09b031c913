package openai

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/internal/tokenbucket"
)

// Key is one API key and what its holder may do. Clients send the key as
// OpenAI's clients do, in "Authorization: Bearer <key>". The handler keeps
// only the key's SHA-256 and compares hashes in constant time; the key
// itself never reaches a log or a metric.
type Key struct {
	// Name identifies the holder. It is the scheduler's client id (per
	// client rate limits, metrics) and what logs show. Required, unique.
	Name string `json:"name"`
	// Secret is the key as clients send it. Give Secret or SHA256.
	Secret string `json:"key,omitempty"`
	// SHA256 is the hex SHA-256 of the key, for key files that should not
	// hold the keys themselves (`printf %s "$KEY" | sha256sum`).
	SHA256 string `json:"key_sha256,omitempty"`
	// MaxTier is the most urgent tier the key may ask for ("critical",
	// "high", "normal", "low", "background"). "" means normal.
	MaxTier string `json:"max_tier,omitempty"`
	// Models lists the model ids the key may use; empty allows all.
	Models []string `json:"models,omitempty"`
	// RequestsPerMinute limits the key's requests; 0 is no limit.
	RequestsPerMinute int `json:"requests_per_minute,omitempty"`
	// TokensPerMinute limits the key's prompt plus generated tokens, as
	// usage reports them; 0 is no limit. A request is admitted while the
	// key has any of its minute left, and its usage is charged when it
	// ends, so one large request can put the key in debt until it refills.
	TokensPerMinute int `json:"tokens_per_minute,omitempty"`
	// Admin allows the operator routes: /metrics and model management.
	Admin bool `json:"admin,omitempty"`
}

// ErrBadKeys means an API key list or key file is malformed.
var ErrBadKeys = errors.New("bad API keys")

// maxKeyFileBytes bounds a key file read by LoadKeyFile.
const maxKeyFileBytes = 1 << 20

// LoadKeyFile reads API keys from a JSON file: {"keys": [Key, ...]} or a
// bare array of keys. Keys are checked by WithAPIKeys.
//
//	{"keys": [
//	  {"name": "ops", "key_sha256": "9f86d0...", "admin": true, "max_tier": "critical"},
//	  {"name": "app", "key": "sk-app-...", "models": ["llama"], "max_tier": "high",
//	   "requests_per_minute": 600, "tokens_per_minute": 200000}
//	]}
func LoadKeyFile(path string) ([]Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKeys, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadKeys, path, err)
	}
	if len(b) > maxKeyFileBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrBadKeys, path, maxKeyFileBytes)
	}
	keys, err := parseKeyJSON(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadKeys, path, err)
	}
	return keys, nil
}

func parseKeyJSON(b []byte) ([]Key, error) {
	b = bytes.TrimSpace(b)
	dec := func(v any) error {
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}
	if len(b) > 0 && b[0] == '[' {
		var keys []Key
		return keys, dec(&keys)
	}
	var file struct {
		Keys []Key `json:"keys"`
	}
	if err := dec(&file); err != nil {
		return nil, err
	}
	if file.Keys == nil {
		return nil, errors.New(`want {"keys": [...]} or a JSON array of keys`)
	}
	return file.Keys, nil
}

// ParseKeyList reads a comma-separated list of name:key pairs (as an
// environment variable holds them). Such keys have full rights, like
// vLLM's --api-key: every model and tier, no limits, admin routes. Use a
// key file for per-key limits.
func ParseKeyList(s string) ([]Key, error) {
	var keys []Key
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, secret, ok := strings.Cut(item, ":")
		if !ok || name == "" || secret == "" {
			return nil, fmt.Errorf("%w: entry %d: want name:key", ErrBadKeys, i+1)
		}
		keys = append(keys, Key{Name: name, Secret: secret, MaxTier: "critical", Admin: true})
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: the list holds no name:key entry", ErrBadKeys)
	}
	return keys, nil
}

// grant is a checked Key as the handler keeps it: the hash, never the key.
type grant struct {
	name    string
	hash    [sha256.Size]byte
	maxTier api.Tier
	models  map[string]bool // nil: every model
	admin   bool

	mu       sync.Mutex          // guards the buckets: requests of one key run at once
	requests *tokenbucket.Bucket // nil: no limit
	tokens   *tokenbucket.Bucket // nil: no limit
}

// compile checks k and turns it into a grant.
func (k *Key) compile() (*grant, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: key %q: %s", ErrBadKeys, k.Name, fmt.Sprintf(format, args...))
	}
	if strings.TrimSpace(k.Name) == "" {
		return nil, fmt.Errorf("%w: a key has no name", ErrBadKeys)
	}
	g := &grant{name: k.Name, admin: k.Admin, maxTier: api.Normal}
	switch {
	case k.Secret != "" && k.SHA256 != "":
		return nil, bad("give key or key_sha256, not both")
	case k.Secret != "":
		if strings.TrimSpace(k.Secret) != k.Secret || len(k.Secret) < 8 {
			return nil, bad("the key must be at least 8 characters without surrounding spaces")
		}
		g.hash = sha256.Sum256([]byte(k.Secret))
	case k.SHA256 != "":
		h, err := hex.DecodeString(strings.TrimSpace(k.SHA256))
		if err != nil || len(h) != sha256.Size {
			return nil, bad("key_sha256 must be 64 hex digits")
		}
		copy(g.hash[:], h)
	default:
		return nil, bad("no key or key_sha256")
	}
	if k.MaxTier != "" {
		t, err := api.ParseTier(k.MaxTier)
		if err != nil {
			return nil, bad("max_tier %q: want critical, high, normal, low or background", k.MaxTier)
		}
		g.maxTier = t
	}
	if len(k.Models) > 0 {
		g.models = make(map[string]bool, len(k.Models))
		for _, m := range k.Models {
			g.models[m] = true
		}
	}
	if k.RequestsPerMinute < 0 || k.TokensPerMinute < 0 {
		return nil, bad("limits must not be negative")
	}
	if k.RequestsPerMinute > 0 {
		g.requests = newBucket(k.RequestsPerMinute)
	}
	if k.TokensPerMinute > 0 {
		g.tokens = newBucket(k.TokensPerMinute)
	}
	return g, nil
}

// WithAPIKeys requires an API key on every route but /health and /ready
// (see Key). Without it the handler serves anyone. Keys from
// LoadKeyFile and ParseKeyList can be combined; names and keys must be
// unique, and at least one key must be given.
func WithAPIKeys(keys ...Key) Option {
	return func(c *config) error {
		if len(keys) == 0 {
			return fmt.Errorf("%w: WithAPIKeys without keys", ErrBadKeys)
		}
		for i := range keys {
			g, err := keys[i].compile()
			if err != nil {
				return err
			}
			for _, prev := range c.keys {
				if prev.name == g.name {
					return fmt.Errorf("%w: two keys named %q", ErrBadKeys, g.name)
				}
				if prev.hash == g.hash {
					return fmt.Errorf("%w: keys %q and %q are the same key", ErrBadKeys, prev.name, g.name)
				}
			}
			c.keys = append(c.keys, g)
		}
		return nil
	}
}
