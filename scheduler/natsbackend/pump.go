package natsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// serverStream is one stream in flight on an instance.
type serverStream struct {
	credit chan int
	cancel context.CancelFunc
}

// pump sends st's chunks to inbox while the client's credit lasts, with
// heartbeats while the stream is quiet, and ends with an error message if
// the stream fails.
func (s *Service) pump(ctx context.Context, st *api.Stream, ss *serverStream, inbox string, credit int) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	hbDone := make(chan struct{})
	defer close(hbDone)
	go s.heartbeats(inbox, &last, hbDone)

	buf := make([]byte, 0, 256)
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			if s.ctx.Err() != nil {
				err = ErrClosed
			}
			if ctx.Err() == nil || s.ctx.Err() != nil { // not cancelled by the client
				_ = s.nc.Publish(inbox, marshalError(msgError, err))
			}
			return
		}
		for credit == 0 {
			if credit = s.waitCredit(ctx, ss); credit == 0 {
				s.cfg.logger.Warn("stream stalled: client renewed no credit; stopping it", "instance", s.name)
				return
			}
		}
		credit--
		buf = append(buf[:0], msgChunk)
		b, _ := json.Marshal(wireChunk{Text: c.Text, Token: c.Token, HasToken: c.HasToken, Logprob: c.Logprob, Finish: c.Finish, Usage: c.Usage})
		buf = append(buf, b...)
		if err := s.nc.Publish(inbox, buf); err != nil {
			return
		}
		last.Store(time.Now().UnixNano())
		if c.Finish != "" {
			return
		}
	}
}

// waitCredit waits for the client's next grant; 0 when ctx ended or the
// client stayed silent past the stall timeout.
func (s *Service) waitCredit(ctx context.Context, ss *serverStream) int {
	t := time.NewTimer(s.cfg.stall)
	defer t.Stop()
	select {
	case n := <-ss.credit:
		return n
	case <-ctx.Done():
	case <-t.C:
	}
	return 0
}

// heartbeats tells the client the stream is alive while no chunk goes out.
func (s *Service) heartbeats(inbox string, last *atomic.Int64, done <-chan struct{}) {
	tick := time.NewTicker(s.cfg.heartbeat)
	defer tick.Stop()
	hb := []byte{msgHeartbeat}
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			if now.UnixNano()-last.Load() >= int64(s.cfg.heartbeat)/2 {
				_ = s.nc.Publish(inbox, hb)
			}
		}
	}
}
