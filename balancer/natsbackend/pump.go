package natsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// serverStream is one stream in flight on an instance.
type serverStream struct {
	credit chan int
	cancel context.CancelFunc
	resend chan uint64   // the client asks for the messages from this number on
	done   chan struct{} // the client has the final chunk
}

func newServerStream(cancel context.CancelFunc) *serverStream {
	return &serverStream{credit: make(chan int, 16), cancel: cancel, resend: make(chan uint64, 4), done: make(chan struct{}, 1)}
}

// pump sends st's chunks to inbox while the client's credit lasts —
// every chunk ready at the time in one message, numbered from 0 — with
// heartbeats (carrying how many chunk messages went out) while the stream
// is quiet, and ends with an error message if the stream fails. The
// numbers let the client see a message lost on the way (a NATS server of
// a cluster went away with it) and ask for it again from the history the
// pump keeps; a finished stream lingers until the client has its final
// chunk.
func (s *Service) pump(ctx context.Context, st *api.Stream, ss *serverStream, inbox string, credit int) {
	var last atomic.Int64
	var sent atomic.Uint64 // chunk messages published so far
	last.Store(time.Now().UnixNano())
	hbDone := make(chan struct{})
	defer close(hbDone)
	go s.heartbeats(inbox, &last, &sent, hbDone)

	ready := make(chan recvResult, 64)
	readerDone := make(chan struct{})
	go read(ctx, st, ready, readerDone)
	defer func() {
		ss.cancel() // ends a Recv in progress
		<-readerDone
	}()

	var (
		batch []wireChunk
		buf   = make([]byte, 0, 512)
		hist  = history{max: credit}
	)
	replay := func(from uint64) {
		for _, m := range hist.since(from) {
			if s.nc.Publish(inbox, m) != nil {
				return
			}
		}
		last.Store(time.Now().UnixNano())
	}
	for {
		for credit == 0 {
			if credit = s.waitCredit(ctx, ss, replay); credit == 0 {
				if ctx.Err() == nil {
					s.cfg.logger.Warn("stream stalled: client renewed no credit; stopping it", "instance", s.name)
				}
				return
			}
		}
		var r recvResult
		select {
		case r = <-ready:
		case from := <-ss.resend:
			replay(from)
			continue
		case <-ctx.Done():
			if s.ctx.Err() != nil { // the service stops: tell the client
				_ = s.nc.Publish(inbox, marshalError(msgError, ErrClosed))
			}
			return
		}
		batch = batch[:0]
		for {
			if r.err != nil {
				break
			}
			batch = append(batch, wireChunk{Text: r.c.Text, Token: r.c.Token, HasToken: r.c.HasToken, Logprob: r.c.Logprob, Finish: r.c.Finish, Usage: r.c.Usage})
			if r.c.Finish != "" || len(batch) == credit {
				break
			}
			select {
			case r = <-ready:
				continue
			default:
			}
			break
		}
		if len(batch) > 0 {
			b, _ := json.Marshal(batch)
			seq := sent.Load()
			buf = strconv.AppendUint(append(buf[:0], msgChunk), seq, 10)
			buf = append(buf, b...)
			final := batch[len(batch)-1].Finish != ""
			if s.drop == nil || !s.drop(seq, final) {
				if err := s.nc.Publish(inbox, buf); err != nil {
					return
				}
			}
			hist.add(buf)
			// Counted once published: a heartbeat that says so goes out
			// after the message.
			sent.Add(1)
			last.Store(time.Now().UnixNano())
			credit -= len(batch)
			if final {
				s.linger(ctx, ss, replay)
				return
			}
		}
		if r.err != nil {
			if !errors.Is(r.err, io.EOF) && (ctx.Err() == nil || s.ctx.Err() != nil) { // not cancelled by the client
				err := r.err
				if s.ctx.Err() != nil {
					err = ErrClosed
				}
				_ = s.nc.Publish(inbox, marshalError(msgError, err))
			}
			return
		}
	}
}

type recvResult struct {
	c   api.Chunk
	err error
}

// read receives st's chunks into ready until the final chunk, an error,
// or ctx's end.
func read(ctx context.Context, st *api.Stream, ready chan<- recvResult, done chan<- struct{}) {
	defer close(done)
	for {
		c, err := st.Recv()
		select {
		case ready <- recvResult{c, err}:
		case <-ctx.Done():
			return
		}
		if err != nil || c.Finish != "" {
			return
		}
	}
}

// waitCredit waits for the client's next grant, answering its resend
// requests meanwhile; 0 when ctx ended or the client stayed silent past
// the stall timeout.
func (s *Service) waitCredit(ctx context.Context, ss *serverStream, replay func(from uint64)) int {
	t := time.NewTimer(s.cfg.stall)
	defer t.Stop()
	for {
		select {
		case n := <-ss.credit:
			return n
		case from := <-ss.resend:
			replay(from)
		case <-ctx.Done():
			return 0
		case <-t.C:
			return 0
		}
	}
}

// heartbeats tells the client the stream is alive while no chunk goes
// out, and how many chunk messages went out.
func (s *Service) heartbeats(inbox string, last *atomic.Int64, sent *atomic.Uint64, done <-chan struct{}) {
	tick := time.NewTicker(s.cfg.heartbeat)
	defer tick.Stop()
	hb := make([]byte, 0, 24)
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			if now.UnixNano()-last.Load() >= int64(s.cfg.heartbeat)/2 {
				hb = strconv.AppendUint(append(hb[:0], msgHeartbeat), sent.Load(), 10)
				_ = s.nc.Publish(inbox, hb)
			}
		}
	}
}
