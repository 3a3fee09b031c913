package httpbackend

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// Option configures a Backend.
type Option func(*config) error

type config struct {
	client        *http.Client
	apiKey        string
	pollInterval  time.Duration
	pollTimeout   time.Duration
	headerTimeout time.Duration
	maxLine       int
	models        []string
	logger        *slog.Logger
	resume        bool
}

// Defaults.
const (
	// DefaultPollInterval is how often /v1/models and /metrics are read
	// unless WithPollInterval says otherwise.
	DefaultPollInterval = 2 * time.Second
	// DefaultHeaderTimeout bounds the wait for the response headers unless
	// WithHeaderTimeout says otherwise. mlxserving sends its headers with
	// the first token, so for it this is a time-to-first-token bound; an
	// embeddings answer comes whole, so for Embed it bounds the request.
	DefaultHeaderTimeout = 60 * time.Second
	// DefaultMaxLine is the longest server-sent event line accepted unless
	// WithMaxLineBytes says otherwise.
	DefaultMaxLine = 1 << 20
)

func defaultConfig() config {
	return config{
		pollInterval:  DefaultPollInterval,
		headerTimeout: DefaultHeaderTimeout,
		maxLine:       DefaultMaxLine,
		logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// WithHTTPClient sends requests with c. The default is a client of its
// own with no overall timeout (streams last as long as generation does).
func WithHTTPClient(c *http.Client) Option {
	return func(cfg *config) error {
		if c == nil {
			return errors.New("http client is nil")
		}
		cfg.client = c
		return nil
	}
}

// WithAPIKey sends key as a bearer token on every request.
func WithAPIKey(key string) Option {
	return func(cfg *config) error {
		if key == "" {
			return errors.New("api key is empty")
		}
		cfg.apiKey = key
		return nil
	}
}

// WithPollInterval sets how often the poller reads /v1/models and
// /metrics. It must be positive; the default is DefaultPollInterval. Each
// poll is bounded by the interval (at least one second).
func WithPollInterval(d time.Duration) Option {
	return func(cfg *config) error {
		if d <= 0 {
			return fmt.Errorf("poll interval %v: must be positive", d)
		}
		cfg.pollInterval = d
		return nil
	}
}

// WithHeaderTimeout bounds the wait for the upstream's response headers;
// past it the request fails with a retryable *Error (the upstream hangs
// before its first byte). Zero waits as long as the request's context
// allows; negative is refused. The default is DefaultHeaderTimeout.
func WithHeaderTimeout(d time.Duration) Option {
	return func(cfg *config) error {
		if d < 0 {
			return fmt.Errorf("header timeout %v: must not be negative", d)
		}
		cfg.headerTimeout = d
		return nil
	}
}

// WithMaxLineBytes bounds one line of the event stream; a longer line
// ends the stream with a *ProtocolError. It must be at least 1 KiB; the
// default is DefaultMaxLine.
func WithMaxLineBytes(n int) Option {
	return func(cfg *config) error {
		if n < 1024 {
			return fmt.Errorf("max line bytes %d: must be at least 1024", n)
		}
		cfg.maxLine = n
		return nil
	}
}

// WithModels declares the models the upstream serves, for upstreams
// whose /v1/models is missing or incomplete. Load reports them beside
// whatever the poller reads.
func WithModels(ids ...string) Option {
	return func(cfg *config) error {
		for _, id := range ids {
			if id == "" {
				return errors.New("model id is empty")
			}
		}
		cfg.models = append(cfg.models, ids...)
		return nil
	}
}

// WithResume marks the upstream as an mlxserving instance, which can
// resume streams: requests ask it for every streamed token's id
// ("return_token_ids"), so a balancer.LoadBalancer can resume a stream
// this upstream breaks off on another backend, and a request carrying
// api.Params.Resume sends it as "resume". Without it (the default: a
// foreign OpenAI-compatible upstream, whose ids are unknown) streams carry
// text only, and a request carrying Resume is refused with ErrNoResume.
func WithResume() Option {
	return func(c *config) error {
		c.resume = true
		return nil
	}
}

// WithLogger logs poll failures (at debug level) and recoveries. The
// default discards.
func WithLogger(l *slog.Logger) Option {
	return func(cfg *config) error {
		if l == nil {
			return errors.New("logger is nil")
		}
		cfg.logger = l
		return nil
	}
}
