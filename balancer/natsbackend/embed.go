package natsbackend

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/mlxserving/mlxserving/api"
)

// An embedding request travels as a generation does: a NATS request to
// the instance's embed endpoint, carrying the api.EmbedRequest as JSON and
// the client's inbox, answered at once with a start message (or a typed
// error). While the instance embeds, it sends heartbeats to the inbox;
// then the vectors, in as many messages as the NATS max_payload needs
// (2048 inputs of 1024 values are 8 MiB, far above the 1 MiB default),
// each a part of consecutive inputs, or an error message. A client that
// gives up sends cancel on the control subject, and a caller's deadline
// travels as the time left (hdrTimeout), so the instance stops on its
// own should the cancel be lost.

// wireEmbeddings heads a part of an api.Embeddings on the wire: the
// vectors of inputs From to From+Count-1, each of Width values, with the
// totals every part repeats. The message is msgEmbed, this JSON, a
// newline, and the vectors' values as little-endian float32, Count*Width
// of them: exact, a third smaller than base64 and a half smaller than
// decimals, and read without a JSON scan of megabytes.
type wireEmbeddings struct {
	Model        string        `json:"m"`
	Inputs       int           `json:"n"` // vectors in all parts together
	From         int           `json:"i"`
	Count        int           `json:"k"`
	Width        int           `json:"w"`
	PromptTokens int           `json:"p,omitempty"`
	Cached       int           `json:"c,omitempty"`
	Duration     time.Duration `json:"d,omitempty"`
}

// defaultMaxPayload is nats-server's default max_payload, assumed for a
// connection that has not learnt the server's.
const defaultMaxPayload = 1 << 20

// handleEmbed runs an embedding request in its own goroutine.
func (s *Service) handleEmbed(r micro.Request) { s.spawn(func() { s.serveEmbed(r) }) }

func (s *Service) serveEmbed(r micro.Request) {
	inbox := r.Headers().Get(hdrStream)
	if inbox == "" {
		s.fail(r, fmt.Errorf("%w: embed request without %s", ErrProtocol, hdrStream))
		return
	}
	var timeout time.Duration
	if t := r.Headers().Get(hdrTimeout); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 {
			s.fail(r, fmt.Errorf("%w: %s %q: want a positive duration", ErrProtocol, hdrTimeout, t))
			return
		}
		timeout = d
	}
	var req api.EmbedRequest
	if err := json.Unmarshal(r.Data(), &req); err != nil {
		s.fail(r, fmt.Errorf("%w: embed request: %v", ErrProtocol, err))
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	if timeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, timeout)
		defer stop()
	}
	id, untrack := s.track(newServerStream(cancel))
	defer untrack()
	if err := r.Respond(nil, micro.WithHeaders(micro.Headers{hdrKind: {"start"}, hdrControl: {s.ctlP + id}})); err != nil {
		return
	}

	var last atomic.Int64
	var sent atomic.Uint64 // stays 0: the parts are not numbered
	last.Store(time.Now().UnixNano())
	hbDone := make(chan struct{})
	// Heartbeats go on while the vectors are encoded and sent: that takes
	// a while for thousands of them.
	defer close(hbDone)
	go s.heartbeats(inbox, &last, &sent, hbDone)
	res, err := s.b.Embed(ctx, req)
	if err == nil {
		var parts [][]byte
		if parts, err = embedParts(res, int(s.nc.MaxPayload())); err == nil {
			for _, p := range parts {
				if s.nc.Publish(inbox, p) != nil {
					return
				}
			}
			return
		}
	}
	if s.ctx.Err() != nil { // the service stops: the client goes elsewhere
		err = ErrClosed
	}
	// Sent even when the client cancelled: it no longer listens, and one
	// message to nobody is cheaper than telling the cases apart.
	_ = s.nc.Publish(inbox, marshalError(msgError, err))
}

// embedParts encodes res as stream messages of at most limit bytes each
// (the NATS max_payload), consecutive vectors of one width per message.
func embedParts(res *api.Embeddings, limit int) ([][]byte, error) {
	if limit <= 0 {
		limit = defaultMaxPayload
	}
	n := len(res.Vectors)
	head := wireEmbeddings{Model: res.Model, Inputs: n, PromptTokens: res.PromptTokens, Cached: res.Cached, Duration: res.Duration}
	var parts [][]byte
	for from := 0; from < n || parts == nil; {
		h := head
		if from < n {
			h.Width = len(res.Vectors[from])
		}
		h.From, h.Count = n, n // as many digits as the header can take
		hb, err := json.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("natsbackend: encode embeddings: %w", err)
		}
		to, size := from, 1+len(hb)+1
		for to < n && len(res.Vectors[to]) == h.Width && size+4*h.Width <= limit {
			size += 4 * h.Width
			to++
		}
		if to == from && from < n {
			return nil, fmt.Errorf("natsbackend: a vector of %d values does not fit the NATS max_payload of %d bytes", h.Width, limit)
		}
		h.From, h.Count = from, to-from
		if hb, err = json.Marshal(h); err != nil {
			return nil, fmt.Errorf("natsbackend: encode embeddings: %w", err)
		}
		msg := make([]byte, 0, 1+len(hb)+1+4*h.Width*h.Count)
		msg = append(append(append(msg, msgEmbed), hb...), '\n')
		for _, v := range res.Vectors[from:to] {
			for _, x := range v {
				msg = binary.LittleEndian.AppendUint32(msg, math.Float32bits(x))
			}
		}
		parts = append(parts, msg)
		from = to
	}
	return parts, nil
}
