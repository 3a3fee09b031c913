package httpbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
)

// Backend is a balancer.Backend over a remote OpenAI-compatible server.
// It is safe for concurrent use; Close stops its poller.
type Backend struct {
	base string // scheme://host[:port][/prefix], without a trailing slash
	cfg  config

	mu      sync.RWMutex
	load    balancer.Load
	reports []func(balancer.Load) // the balancers' (OnLoad), told of each poll
	pollErr error
	closed  bool

	stop chan struct{}
	done chan struct{}
}

var (
	_ balancer.Backend       = (*Backend)(nil)
	_ balancer.HealthChecker = (*Backend)(nil)
	_ balancer.LoadReporter  = (*Backend)(nil)
)

// New returns a Backend for the server at baseURL (http or https, with an
// optional path prefix before /v1) and starts its poller, which reads the
// upstream's models and load at once and then every poll interval.
func New(baseURL string, opts ...Option) (*Backend, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("httpbackend: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("httpbackend: base URL %q: want http(s)://host[:port][/prefix]", baseURL)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("httpbackend: %w", err)
		}
	}
	if cfg.client == nil {
		cfg.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	b := &Backend{
		base: strings.TrimRight(u.String(), "/"), cfg: cfg,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	b.load.Models = append([]string(nil), cfg.models...)
	go b.pollLoop()
	return b, nil
}

// URL returns the upstream's base URL.
func (b *Backend) URL() string { return b.base }

// Generate streams a completion from the upstream's /v1/completions.
func (b *Backend) Generate(ctx context.Context, req api.Request) (*api.Stream, error) {
	if len(req.Resume) > 0 && !b.cfg.resume {
		return nil, ErrNoResume
	}
	body, err := completionBody(req, b.cfg.resume)
	if err != nil {
		return nil, fmt.Errorf("httpbackend: encode request: %w", err)
	}
	return b.start(ctx, "/v1/completions", req.Model, req.Params, body)
}

// Embed is not carried over HTTP yet: it returns an error wrapping
// errors.ErrUnsupported.
func (b *Backend) Embed(context.Context, api.EmbedRequest) (*api.Embeddings, error) {
	return nil, fmt.Errorf("httpbackend: embeddings: %w", errors.ErrUnsupported)
}

// Chat streams a chat completion from the upstream's /v1/chat/completions.
func (b *Backend) Chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error) {
	if len(req.Resume) > 0 && !b.cfg.resume {
		return nil, ErrNoResume
	}
	body, err := chatBody(req, b.cfg.resume)
	if err != nil {
		return nil, fmt.Errorf("httpbackend: encode request: %w", err)
	}
	return b.start(ctx, "/v1/chat/completions", req.Model, req.Params, body)
}

// start sends the request and waits for the response headers: an error
// status or no response becomes an *Error, a 200 event stream a Stream.
func (b *Backend) start(ctx context.Context, path, model string, p api.Params, body []byte) (*api.Stream, error) {
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	endpoint := b.base + path
	reqCtx, cancel := context.WithCancelCause(ctx)
	hreq, err := http.NewRequestWithContext(reqCtx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("httpbackend: %w", err)
	}
	setHeaders(hreq.Header, p, b.cfg.apiKey)
	begun := time.Now()
	var timer *time.Timer
	if b.cfg.headerTimeout > 0 {
		timer = time.AfterFunc(b.cfg.headerTimeout, func() { cancel(ErrHeaderTimeout) })
	}
	resp, err := b.cfg.client.Do(hreq)
	if timer != nil && !timer.Stop() && err == nil {
		err = context.Cause(reqCtx) // the timeout fired as the headers came
		_ = resp.Body.Close()
	}
	if err != nil {
		cause := context.Cause(reqCtx)
		cancel(nil)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(cause, ErrHeaderTimeout) {
			err = ErrHeaderTimeout
		}
		return nil, &Error{URL: endpoint, Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		cancel(nil)
		return nil, statusError(endpoint, resp, msg)
	}
	h := api.Header{Model: model, Session: resp.Header.Get("X-Session-ID"), Cache: resp.Header.Get("X-Cache"), Backend: b.base}
	if h.Session == "" {
		h.Session = p.Session
	}
	switch mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt {
	case "text/event-stream":
	case "application/json": // an upstream that ignores stream:true
		whole, err := io.ReadAll(io.LimitReader(resp.Body, maxWhole+1))
		_ = resp.Body.Close()
		cancel(nil)
		if err != nil {
			return nil, &Error{URL: endpoint, Err: err}
		}
		src, err := wholeResponse(whole, begun)
		if err != nil {
			return nil, &Error{URL: endpoint, Err: err}
		}
		return api.NewStream(ctx, src, h), nil
	default:
		head, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		_ = resp.Body.Close()
		cancel(nil)
		return nil, &Error{URL: endpoint, Err: protocolError(fmt.Sprintf("content type %q, want text/event-stream", mt), head)}
	}
	src := newSource(endpoint, resp.Body, func() { cancel(context.Canceled) }, begun, b.cfg.maxLine, nil)
	return api.NewStream(ctx, src, h), nil
}

// Load returns the load the poller last read, with the models declared by
// WithModels. It does not touch the network.
func (b *Backend) Load() balancer.Load {
	b.mu.RLock()
	defer b.mu.RUnlock()
	l := b.load
	l.Models = append([]string(nil), l.Models...)
	return l
}

// OnLoad registers report to be called with each load the poller reads,
// before Load returns it (see [balancer.LoadReporter]).
func (b *Backend) OnLoad(report func(balancer.Load)) {
	b.mu.Lock()
	b.reports = append(b.reports, report)
	b.mu.Unlock()
}

// PollErr returns the last poll's error, nil after a successful one.
func (b *Backend) PollErr() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.pollErr
}

// CheckHealth reads the upstream's /v1/models: nil when it answers 200.
func (b *Backend) CheckHealth(ctx context.Context) error {
	_, err := b.models(ctx)
	return err
}

// Close stops the poller. Streams already returned go on; new requests
// fail with ErrClosed. It is idempotent.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	<-b.done
	return nil
}
