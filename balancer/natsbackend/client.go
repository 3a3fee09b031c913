package natsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/retry"
)

// Client is a balancer.Backend reaching one instance over NATS. Discover
// makes one per instance it finds and keeps its load report fresh.
type Client struct {
	nc       *nats.Conn
	instance string
	id       string
	generate string
	chat     string
	cfg      clientConfig
	// gone, when set (Discover sets it), is told that the instance's
	// subject has no responders: the instance is gone, not slow.
	gone func(id string)
	// lost is closed once discovery knows the instance is gone; its open
	// streams then end at once with ErrInstanceLost (the balancer fails
	// them over, or resumes those that delivered tokens).
	lost     chan struct{}
	lostOnce sync.Once

	mu      sync.RWMutex
	load    balancer.Load
	reports []func(balancer.Load) // the balancers' (OnLoad), told of each report
}

var (
	_ balancer.Backend      = (*Client)(nil)
	_ balancer.LoadReporter = (*Client)(nil)
)

type clientConfig struct {
	window         int
	heartbeat      time.Duration
	startTimeout   time.Duration
	reconnectGrace time.Duration
}

// markLost tells the Client's streams that the instance is gone — unless
// it said it was draining: then it left discovery on purpose and serves
// the streams it has to their end (should it die meanwhile, the heartbeat
// timeout ends them).
func (c *Client) markLost() {
	if c.lost != nil && !c.Load().Draining {
		c.lostOnce.Do(func() { close(c.lost) })
	}
}

// connected waits, up to the reconnect grace, for a reconnecting
// connection: moving to another server of a NATS cluster takes
// milliseconds, and failing every request meanwhile would refuse them all
// (every instance shares the connection). It reports whether the
// connection is up.
func (c *Client) connected(ctx context.Context) bool {
	if c.nc.Status() == nats.CONNECTED {
		return true
	}
	deadline := time.Now().Add(c.cfg.reconnectGrace)
	for c.nc.IsReconnecting() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	return c.nc.Status() == nats.CONNECTED
}

// request sends msg and waits, up to the start timeout, for the
// instance's answer — or until discovery finds the instance gone: one
// that stopped without closing its connection would otherwise hold the
// request the whole start timeout.
func (c *Client) request(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.startTimeout)
	defer cancel()
	if c.lost != nil {
		if c.isLost() {
			return nil, context.Canceled
		}
		answered := make(chan struct{})
		defer close(answered)
		go func() {
			select {
			case <-c.lost:
				cancel()
			case <-answered:
			}
		}()
	}
	return c.nc.RequestMsgWithContext(rctx, msg)
}

// isLost reports whether discovery found the instance gone.
func (c *Client) isLost() bool {
	select {
	case <-c.lost:
		return true
	default:
		return false
	}
}

// Instance returns the instance's name.
func (c *Client) Instance() string { return c.instance }

// Load returns the instance's load as its last stats answer reported it.
func (c *Client) Load() balancer.Load {
	c.mu.RLock()
	defer c.mu.RUnlock()
	l := c.load
	l.Models = append([]string(nil), l.Models...)
	return l
}

// OnLoad registers report to be called with each load report the
// instance sends, before Load returns it (see [balancer.LoadReporter]).
func (c *Client) OnLoad(report func(balancer.Load)) {
	c.mu.Lock()
	c.reports = append(c.reports, report)
	c.mu.Unlock()
}

// setLoad records a load report, telling the balancers first, so a
// balancer routes by it as soon as Load shows it.
func (c *Client) setLoad(l balancer.Load) {
	c.mu.RLock()
	reports := c.reports
	c.mu.RUnlock()
	for _, report := range reports {
		r := l // each its own copy of the models
		r.Models = append([]string(nil), l.Models...)
		report(r)
	}
	c.mu.Lock()
	c.load = l
	c.mu.Unlock()
}

// Generate sends a completion request to the instance.
func (c *Client) Generate(ctx context.Context, req api.Request) (*api.Stream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("natsbackend: encode request: %w", err)
	}
	return c.start(ctx, c.generate, b)
}

// Embed is not carried over NATS yet: it returns an error wrapping
// errors.ErrUnsupported.
func (c *Client) Embed(context.Context, api.EmbedRequest) (*api.Embeddings, error) {
	return nil, fmt.Errorf("natsbackend: embeddings: %w", errors.ErrUnsupported)
}

// Chat sends a chat request to the instance.
func (c *Client) Chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("natsbackend: encode request: %w", err)
	}
	return c.start(ctx, c.chat, b)
}

func (c *Client) start(ctx context.Context, subject string, data []byte) (*api.Stream, error) {
	if !c.connected(ctx) {
		// Still reconnecting: a request would sit in the reconnect buffer
		// until the start timeout; fail now so the balancer tries elsewhere.
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, transportError(c.instance, fmt.Errorf("%w: NATS connection is %s", ErrNotConnected, c.nc.Status()))
	}
	inbox := c.nc.NewInbox()
	ch := make(chan *nats.Msg, c.cfg.window+64)
	sub, err := c.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, transportError(c.instance, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(hdrStream, inbox)
	msg.Header.Set(hdrWindow, strconv.Itoa(c.cfg.window))
	reply, err := c.request(ctx, msg)
	if err != nil {
		_ = sub.Unsubscribe()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, nats.ErrNoResponders) && c.gone != nil {
			c.gone(c.id)
		}
		switch {
		case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			err = fmt.Errorf("%w: %w", ErrInstanceLost, err)
		case c.isLost(): // not the caller's cancellation: the balancer fails over
			err = fmt.Errorf("%w: found gone before it answered", ErrInstanceLost)
		}
		return nil, transportError(c.instance, err)
	}
	switch reply.Header.Get(hdrKind) {
	case "start":
	case "error":
		_ = sub.Unsubscribe()
		var w wireError
		if err := json.Unmarshal(reply.Data, &w); err != nil {
			return nil, transportError(c.instance, fmt.Errorf("%w: error reply: %v", ErrProtocol, err))
		}
		return nil, fromWire(c.instance, w)
	default:
		_ = sub.Unsubscribe()
		return nil, transportError(c.instance, fmt.Errorf("%w: reply of kind %q", ErrProtocol, reply.Header.Get(hdrKind)))
	}
	var h api.Header
	if err := json.Unmarshal(reply.Data, &h); err != nil {
		_ = sub.Unsubscribe()
		return nil, transportError(c.instance, fmt.Errorf("%w: start reply: %v", ErrProtocol, err))
	}
	h.Backend = c.instance
	src := &clientStream{c: c, sub: sub, ch: ch, control: reply.Header.Get(hdrControl), closed: make(chan struct{}),
		timer: time.NewTimer(3 * c.cfg.heartbeat)}
	return api.NewStream(ctx, src, h), nil
}

// clientStream is a stream from an instance, read from the client's inbox.
type clientStream struct {
	c       *Client
	sub     *nats.Subscription
	ch      chan *nats.Msg
	control string
	timer   *time.Timer

	consumed  int
	delivered int
	pending   []wireChunk
	next      uint64 // the number of the next chunk message
	// behind is when the stream found messages missing (zero while none
	// is), asked when it last asked the instance for them again.
	behind, asked time.Time

	once     sync.Once
	mu       sync.Mutex
	ended    bool
	closeErr error
	closed   chan struct{}
}

// Recv returns the next chunk; see api.Source.
func (s *clientStream) Recv(ctx context.Context) (api.Chunk, error) {
	s.mu.Lock()
	ended := s.ended
	s.mu.Unlock()
	if len(s.pending) > 0 {
		return s.pop()
	}
	if ended {
		return api.Chunk{}, s.endErr()
	}
	for {
		s.timer.Reset(3 * s.c.cfg.heartbeat)
		// Once the instance is known gone (a probe found no responders,
		// discovery removed it), the stream ends now instead of after three
		// missed heartbeats, with the error the balancer fails over on
		// before the first token and resumes on after it.
		select {
		case m := <-s.ch:
			if c, more, err := s.message(m); !more || err != nil {
				return c, err
			}
		case <-s.c.lost:
			select {
			case m := <-s.ch: // what it sent before it went comes first
				if c, more, err := s.message(m); !more || err != nil {
					return c, err
				}
			default:
				return api.Chunk{}, s.lostInstance()
			}
		case <-s.timer.C:
			return api.Chunk{}, s.fail(ErrInstanceLost)
		case <-ctx.Done():
			s.Close(ctx.Err())
			return api.Chunk{}, ctx.Err()
		case <-s.closed:
			return api.Chunk{}, s.endErr()
		}
	}
}

// message handles one message from the instance: a chunk or an error to
// return, or, for a heartbeat or a message to skip, more (unless err).
func (s *clientStream) message(m *nats.Msg) (c api.Chunk, more bool, err error) {
	if len(m.Data) == 0 {
		return api.Chunk{}, false, s.fail(fmt.Errorf("%w: empty stream message", ErrProtocol))
	}
	switch m.Data[0] {
	case msgHeartbeat:
		if sent, _, ok := seqPrefix(m.Data[1:]); ok && sent > s.next {
			return api.Chunk{}, true, s.missing(sent)
		}
		return api.Chunk{}, true, nil
	case msgError:
		var w wireError
		if err := json.Unmarshal(m.Data[1:], &w); err != nil {
			return api.Chunk{}, false, s.fail(fmt.Errorf("%w: error message: %v", ErrProtocol, err))
		}
		return api.Chunk{}, false, s.fail(fromWire(s.c.instance, w))
	case msgChunk:
		data := m.Data[1:]
		if seq, rest, ok := seqPrefix(data); ok {
			switch {
			case seq < s.next: // replayed twice
				return api.Chunk{}, true, nil
			case seq > s.next: // an earlier one went missing: wait for its replay
				return api.Chunk{}, true, s.missing(seq)
			}
			s.next++
			s.behind, s.asked = time.Time{}, time.Time{}
			data = rest
		}
		c, err := s.chunk(data)
		return c, false, err
	}
	return api.Chunk{}, false, s.fail(fmt.Errorf("%w: message kind %q", ErrProtocol, m.Data[0]))
}

// seqPrefix reads the decimal number that starts a chunk message or a
// heartbeat (an instance of an older version sends none: ok is false).
func seqPrefix(b []byte) (n uint64, rest []byte, ok bool) {
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, b, false
	}
	n, err := strconv.ParseUint(string(b[:i]), 10, 64)
	return n, b[i:], err == nil
}

// missing handles a sign that the chunk messages from s.next to seq went
// missing on the way (a NATS server of a cluster went away with them): it
// asks the instance to send them again, at once and then once a heartbeat,
// and fails the stream once it has waited three heartbeats for them — it
// cannot go on without their text.
func (s *clientStream) missing(seq uint64) error {
	now := time.Now()
	if s.behind.IsZero() {
		s.behind = now
	}
	if now.Sub(s.behind) > 3*s.c.cfg.heartbeat {
		return s.fail(fmt.Errorf("%w: %d stream messages lost on the way", ErrInstanceLost, seq-s.next))
	}
	if s.asked.IsZero() || now.Sub(s.asked) >= s.c.cfg.heartbeat {
		s.asked = now
		_ = s.c.nc.Publish(s.control, strconv.AppendUint([]byte{ctlResend}, s.next, 10))
	}
	return nil
}

// chunk decodes a message of chunks and returns the first.
func (s *clientStream) chunk(data []byte) (api.Chunk, error) {
	if err := json.Unmarshal(data, &s.pending); err != nil || len(s.pending) == 0 {
		s.pending = nil
		return api.Chunk{}, s.fail(fmt.Errorf("%w: chunks: %v", ErrProtocol, err))
	}
	return s.pop()
}

// pop returns the next decoded chunk, renewing the credit as chunks are
// consumed.
func (s *clientStream) pop() (api.Chunk, error) {
	w := s.pending[0]
	s.pending = s.pending[1:]
	c := api.Chunk{Text: w.Text, Token: w.Token, HasToken: w.HasToken, Logprob: w.Logprob, Finish: w.Finish, Usage: w.Usage}
	if c.Finish != "" {
		_ = s.c.nc.Publish(s.control, []byte{ctlDone}) // the instance may forget the stream
		s.finish(nil)
		return c, nil
	}
	if c.HasToken || c.Text != "" {
		s.delivered++
	}
	s.consumed++
	if half := max(s.c.cfg.window/2, 1); s.consumed >= half {
		_ = s.c.nc.Publish(s.control, []byte(string(rune(ctlCredit))+strconv.Itoa(s.consumed)))
		s.consumed = 0
	}
	return c, nil
}

// lostInstance ends the stream of an instance discovery found gone. The
// instance is told to stop, should it be alive after all (its connection
// only moving to another server of a NATS cluster): the balancer goes on
// elsewhere.
func (s *clientStream) lostInstance() error {
	_ = s.c.nc.Publish(s.control, []byte{ctlCancel})
	return s.fail(ErrInstanceLost)
}

// fail ends the stream with err: an *Error (retry-safe) while nothing
// reached the caller, a *retry.InterruptedError after.
func (s *clientStream) fail(err error) error {
	var e *Error
	if !errors.As(err, &e) {
		e = transportError(s.c.instance, err)
	}
	err = e
	if s.delivered > 0 {
		err = &retry.InterruptedError{Delivered: s.delivered, Err: e}
	}
	s.finish(err)
	return err
}

func (s *clientStream) finish(err error) {
	s.mu.Lock()
	if !s.ended {
		s.ended = true
		if err == nil {
			err = errEOF
		}
		s.closeErr = err
	}
	s.mu.Unlock()
	s.release(false)
}

func (s *clientStream) endErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeErr == errEOF {
		return io.EOF
	}
	return s.closeErr
}

// Close stops the stream and tells the instance to stop generating.
func (s *clientStream) Close(err error) {
	s.mu.Lock()
	wasEnded := s.ended
	if !s.ended {
		s.ended = true
		if err == nil {
			err = context.Canceled
		}
		s.closeErr = err
	}
	s.mu.Unlock()
	s.release(!wasEnded)
}

func (s *clientStream) release(cancel bool) {
	s.once.Do(func() {
		if cancel {
			_ = s.c.nc.Publish(s.control, []byte{ctlCancel})
		}
		_ = s.sub.Unsubscribe()
		s.timer.Stop()
		close(s.closed)
	})
}
