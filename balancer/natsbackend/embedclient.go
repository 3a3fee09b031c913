package natsbackend

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/api"
)

// embedHeadroom is what an embed request's headers (its inbox, the time
// left) and NATS's framing may take of the max_payload.
const embedHeadroom = 1024

// Embed sends an embedding request to the instance and waits for its
// vectors. A request whose JSON is over the NATS max_payload (2048 long
// inputs, or inputs as token ids) goes as several requests of
// consecutive inputs, concurrently, to the same instance, and their
// answers are put together in order; an input that alone does not fit is
// refused with an *api.InvalidParamError. The vectors come back in parts
// that each fit the max_payload.
//
// A refusal by the instance returns the same typed error the instance's
// backend returned (errors.As finds the *api.InvalidParamError, the
// *engine.ContextLengthError, the *scheduler.RateLimitError); an instance
// that goes away before it answered (no responders, found gone by
// discovery's probes, three missed heartbeats) returns an *Error
// wrapping ErrInstanceLost, which a balancer fails over on. When ctx
// ends, the instance is told to stop.
func (c *Client) Embed(ctx context.Context, req api.EmbedRequest) (*api.Embeddings, error) {
	if c.embed == "" {
		return nil, transportError(c.instance, fmt.Errorf("%w: the instance has no embed endpoint (a version without embeddings)", errors.ErrUnsupported))
	}
	if !c.connected(ctx) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, transportError(c.instance, fmt.Errorf("%w: NATS connection is %s", ErrNotConnected, c.nc.Status()))
	}
	limit := int(c.nc.MaxPayload())
	if limit <= 0 {
		limit = defaultMaxPayload
	}
	groups, err := splitEmbed(req, limit-embedHeadroom)
	if err != nil {
		return nil, err
	}
	if len(groups) == 1 {
		return c.embedOnce(ctx, groups[0])
	}
	return c.embedGroups(ctx, groups)
}

// embedGroup is one NATS request of an Embed call: n inputs from input
// from on, encoded.
type embedGroup struct {
	from, n int
	data    []byte
}

// splitEmbed encodes req as one request, or, when that is over budget
// bytes, as several of consecutive inputs that each fit.
func splitEmbed(req api.EmbedRequest, budget int) ([]embedGroup, error) {
	whole, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("natsbackend: encode request: %w", err)
	}
	if len(whole) <= budget {
		return []embedGroup{{n: len(req.Inputs), data: whole}}, nil
	}
	if n := len(req.Inputs); n > api.MaxEmbedInputs {
		// Refused as the instance would: split, the parts would pass.
		return nil, &api.InvalidParamError{Param: "input", Reason: fmt.Sprintf("%d inputs; at most %d per request", n, api.MaxEmbedInputs)}
	}
	base := req
	base.Inputs = []api.EmbedInput{}
	b, err := json.Marshal(base)
	if err != nil {
		return nil, fmt.Errorf("natsbackend: encode request: %w", err)
	}
	var groups []embedGroup
	for from := 0; from < len(req.Inputs); {
		to, size := from, len(b)
		for to < len(req.Inputs) {
			in, err := json.Marshal(req.Inputs[to])
			if err != nil {
				return nil, fmt.Errorf("natsbackend: encode request: %w", err)
			}
			if size+len(in)+1 > budget { // and a comma
				break
			}
			size += len(in) + 1
			to++
		}
		if to == from {
			return nil, &api.InvalidParamError{Param: "input",
				Reason: fmt.Sprintf("input %d does not fit a NATS message (max_payload %d bytes)", from, budget+embedHeadroom)}
		}
		sub := req
		sub.Inputs = req.Inputs[from:to]
		data, err := json.Marshal(sub)
		if err != nil {
			return nil, fmt.Errorf("natsbackend: encode request: %w", err)
		}
		groups = append(groups, embedGroup{from: from, n: to - from, data: data})
		from = to
	}
	return groups, nil
}

// embedGroups sends the groups concurrently and puts their answers
// together; the first failure cancels the others and is returned.
func (c *Client) embedGroups(ctx context.Context, groups []embedGroup) (*api.Embeddings, error) {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]*api.Embeddings, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.embedOnce(gctx, g)
			if errs[i] != nil {
				errs[i] = inputIndex(errs[i], g.from)
				cancel()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var first error
	for _, err := range errs {
		switch {
		case err == nil:
		case first == nil || errors.Is(first, context.Canceled): // the failure, not the cancellation it caused
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	res := &api.Embeddings{Model: results[0].Model}
	for _, r := range results {
		res.Vectors = append(res.Vectors, r.Vectors...)
		res.PromptTokens += r.PromptTokens
		res.Cached += r.Cached
		res.Duration = max(res.Duration, r.Duration)
	}
	return res, nil
}

// embedOnce sends one embed request and reads its answer.
func (c *Client) embedOnce(ctx context.Context, g embedGroup) (*api.Embeddings, error) {
	inbox := c.nc.NewInbox()
	// Room for every part (each holds a vector at least) and heartbeats:
	// a channel subscription drops what does not fit.
	ch := make(chan *nats.Msg, g.n+64)
	sub, err := c.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, transportError(c.instance, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := nats.NewMsg(c.embed)
	msg.Data = g.data
	msg.Header.Set(hdrStream, inbox)
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return nil, context.DeadlineExceeded
		}
		msg.Header.Set(hdrTimeout, left.String())
	}
	reply, err := c.call(ctx, msg)
	if err != nil {
		return nil, err
	}
	control := reply.Header.Get(hdrControl)
	stop := func() { _ = c.nc.Publish(control, []byte{ctlCancel}) }
	a := &embedAssembly{instance: c.instance, res: &api.Embeddings{Vectors: make([][]float32, g.n)}, left: g.n}
	timer := time.NewTimer(3 * c.cfg.heartbeat)
	defer timer.Stop()
	for !a.complete() {
		select {
		case m := <-ch:
			if err := a.add(m); err != nil {
				stop()
				return nil, err
			}
			timer.Reset(3 * c.cfg.heartbeat)
		case <-c.lost:
			// What it sent before it went comes first.
			for !a.complete() {
				select {
				case m := <-ch:
					if err := a.add(m); err != nil {
						stop()
						return nil, err
					}
					continue
				default:
				}
				stop() // should it be alive after all, it stops
				return nil, transportError(c.instance, ErrInstanceLost)
			}
		case <-timer.C:
			stop()
			return nil, transportError(c.instance, ErrInstanceLost)
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
	}
	return a.res, nil
}

// embedAssembly puts the parts of one embed answer together.
type embedAssembly struct {
	instance string
	res      *api.Embeddings
	left     int  // vectors not received yet
	parts    bool // a part came (an answer of no vectors has one)
}

// complete reports whether every vector came.
func (a *embedAssembly) complete() bool { return a.parts && a.left == 0 }

// add takes one message from the instance: a part, a heartbeat, or the
// instance's error.
func (a *embedAssembly) add(m *nats.Msg) error {
	if len(m.Data) == 0 {
		return transportError(a.instance, fmt.Errorf("%w: empty message", ErrProtocol))
	}
	switch m.Data[0] {
	case msgHeartbeat:
		return nil
	case msgError:
		var w wireError
		if err := json.Unmarshal(m.Data[1:], &w); err != nil {
			return transportError(a.instance, fmt.Errorf("%w: error message: %v", ErrProtocol, err))
		}
		return fromWire(a.instance, w)
	case msgEmbed:
		head, data, ok := bytes.Cut(m.Data[1:], []byte{'\n'})
		var p wireEmbeddings
		if !ok || json.Unmarshal(head, &p) != nil {
			return transportError(a.instance, fmt.Errorf("%w: embeddings part without its header", ErrProtocol))
		}
		vs := a.res.Vectors
		if p.Inputs != len(vs) || p.From < 0 || p.Count < 0 || p.From+p.Count > len(vs) || (p.Count > 0 && p.Width < 1) ||
			len(data) != 4*p.Count*p.Width {
			return transportError(a.instance, fmt.Errorf("%w: %d vectors of %d values from %d of %d in %d bytes, for %d inputs", ErrProtocol,
				p.Count, p.Width, p.From, p.Inputs, len(data), len(vs)))
		}
		for i := range p.Count {
			if vs[p.From+i] != nil {
				return transportError(a.instance, fmt.Errorf("%w: vector %d twice", ErrProtocol, p.From+i))
			}
			v := make([]float32, p.Width)
			for j := range v {
				v[j] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*j:]))
			}
			data = data[4*p.Width:]
			vs[p.From+i] = v
		}
		a.left -= p.Count
		a.parts = true
		a.res.Model, a.res.PromptTokens, a.res.Cached, a.res.Duration = p.Model, p.PromptTokens, p.Cached, p.Duration
		return nil
	}
	return transportError(a.instance, fmt.Errorf("%w: message kind %q", ErrProtocol, m.Data[0]))
}

// inputIndex renames "input[k]" in an instance's refusal of a group of
// inputs from input from on to the index the caller knows.
func inputIndex(err error, from int) error {
	var e *Error
	if from == 0 || !errors.As(err, &e) {
		return err
	}
	k, ok := strings.CutPrefix(e.Param, "input[")
	if !ok {
		return err
	}
	k, ok = strings.CutSuffix(k, "]")
	i, perr := strconv.Atoi(k)
	if !ok || perr != nil {
		return err
	}
	e.Param = "input[" + strconv.Itoa(from+i) + "]"
	e.Message = strings.Replace(e.Message, "input["+k+"]", e.Param, 1)
	return err
}
