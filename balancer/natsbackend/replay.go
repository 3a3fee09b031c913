package natsbackend

import (
	"bytes"
	"context"
	"time"
)

// Control message kinds of the replay: a client that missed chunk
// messages asks for them again, and says when it has the final chunk.
const (
	ctlResend = 'r' // followed by the number of the first message missing
	ctlDone   = 'd'
)

// history keeps a stream's last chunk messages, so that a client that
// missed some (a NATS server of a cluster went away with them) can have
// them again. A client holds at most its window of chunks unread, so the
// messages from the first it misses on are among the last window ones.
type history struct {
	msgs [][]byte
	base uint64 // the number of msgs[0]
	max  int
}

func (h *history) add(msg []byte) {
	h.msgs = append(h.msgs, bytes.Clone(msg))
	if len(h.msgs) > h.max {
		h.msgs[0] = nil
		h.msgs = h.msgs[1:]
		h.base++
	}
}

// since returns the messages from number from on; nil when they are no
// longer kept.
func (h *history) since(from uint64) [][]byte {
	if from < h.base || from-h.base >= uint64(len(h.msgs)) {
		return nil
	}
	return h.msgs[from-h.base:]
}

// linger keeps a finished stream's history for its client until the
// client says it has the final chunk, or for three heartbeats (when the
// client would give up waiting anyway), answering its resend requests.
func (s *Service) linger(ctx context.Context, ss *serverStream, replay func(from uint64)) {
	t := time.NewTimer(3 * s.cfg.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ss.done:
			return
		case from := <-ss.resend:
			replay(from)
		case <-ctx.Done():
			return
		case <-t.C:
			return
		}
	}
}
