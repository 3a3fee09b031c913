package openai

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/mlxserving/mlxserving/api"
)

// sseWriter writes server-sent events, flushing each one so every token
// reaches the client as soon as it is generated. The Stream buffers tokens,
// so a slow reader slows only its own writes, never the batcher.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	buf     []byte
}

func (s *sseWriter) start() {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	s.started = true
}

func (s *sseWriter) send(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// streamSSE sends the stream as chunks in OpenAI's shape, ending with
// data: [DONE]. The status line waits for the first chunk, so a request
// that fails before its first token still gets a proper error status.
func (h *Handler) streamSSE(w http.ResponseWriter, st *api.Stream, f *format) error {
	s := &sseWriter{w: w, rc: http.NewResponseController(w), buf: make([]byte, 0, 512)}
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return s.fail(err)
		}
		if err := s.chunk(f, c); err != nil {
			return err
		}
	}
	if !s.started {
		return s.fail(errors.New("stream ended without a final chunk"))
	}
	if b := finishedComment(s.buf[:0], finishedBy(st, f.usage), f.usage); len(b) > 0 {
		if err := s.send(b); err != nil {
			return err
		}
	}
	return s.send(append(s.buf[:0], "data: [DONE]\n\n"...))
}

// finishedComment is the SSE comment that ends a stream which resumed
// after losing its engine worker or backend, or that a load balancer
// routed: ": finished backend=NAME resumes=N resume_gap_ms=MS" (fields
// without a value left out). Clients skip comments; nil when there is
// nothing to say.
func finishedComment(b []byte, backend string, u *api.Usage) []byte {
	resumes := u != nil && u.Resumes > 0
	if backend == "" && !resumes {
		return nil
	}
	b = append(b, ": finished"...)
	if backend != "" {
		b = append(append(b, " backend="...), strings.Map(commentSafe, backend)...)
	}
	if resumes {
		b = strconv.AppendInt(append(b, " resumes="...), int64(u.Resumes), 10)
		b = strconv.AppendInt(append(b, " resume_gap_ms="...), u.ResumeGap.Milliseconds(), 10)
	}
	return append(b, "\n\n"...)
}

// finishedBy names the backend that finished the stream: the usage's,
// else the one the balancer first routed to.
func finishedBy(st *api.Stream, u *api.Usage) string {
	if u != nil && u.Backend != "" {
		return u.Backend
	}
	return st.Header().Backend
}

// commentSafe keeps a backend name on its comment line.
func commentSafe(r rune) rune {
	if r == '\n' || r == '\r' || r == ' ' {
		return '_'
	}
	return r
}

// chunk sends what one stream chunk holds: its text (and logprob), and on
// the final chunk the finish reason and, if asked for, the usage.
func (s *sseWriter) chunk(f *format, c api.Chunk) error {
	if c.HasToken {
		f.generated++
	}
	if !s.started {
		s.start()
		if f.chat {
			if err := s.send(f.roleChunk(s.buf[:0])); err != nil {
				return err
			}
		}
	}
	if err := s.text(f, c, false); err != nil {
		return err
	}
	if c.Finish == "" {
		return nil
	}
	f.usage = c.Usage
	finish := c.Finish
	if f.reasoning != nil {
		// What the reasoning parser held back: a partial tag or a truncated block.
		if err := s.text(f, api.Chunk{}, true); err != nil {
			return err
		}
	}
	if f.tools != nil {
		rest, calls, tail := f.tools.finish()
		if rest != "" {
			if err := s.send(f.tokenChunk(s.buf[:0], api.Chunk{Text: rest}, "")); err != nil {
				return err
			}
		}
		if err := s.deltas(f, tail); err != nil {
			return err
		}
		if len(calls) > 0 && f.tools.streamed {
			finish = "tool_calls"
		} else if len(calls) > 0 {
			if err := s.deltas(f, callDeltas(calls)); err != nil {
				return err
			}
			finish = "tool_calls"
		}
	}
	if err := s.send(f.finishChunk(s.buf[:0], finish)); err != nil {
		return err
	}
	if f.includeUsage {
		return s.send(f.usageChunk(s.buf[:0], c.Usage))
	}
	return nil
}

// text sends a chunk's text: its reasoning and content (the content
// through the tool-call parser), and the tool-call deltas it completes.
// flush sends what the reasoning parser held back instead of c's text.
func (s *sseWriter) text(f *format, c api.Chunk, flush bool) error {
	var reasoning string
	switch {
	case flush:
		reasoning, c.Text = f.reasoning.Flush()
	case f.reasoning != nil:
		reasoning, c.Text = f.reasoning.Feed(c.Text)
	}
	var deltas []toolDelta
	if f.tools != nil {
		c.Text, deltas = f.tools.feed(c.Text)
	}
	if c.Text != "" || reasoning != "" || ((f.logprobs || f.tokenIDs) && c.HasToken) {
		if err := s.send(f.tokenChunk(s.buf[:0], c, reasoning)); err != nil {
			return err
		}
	}
	return s.deltas(f, deltas)
}

// fail reports err: as an error response before the stream started, as an
// error event after.
func (s *sseWriter) fail(err error) error {
	if !s.started {
		writeError(s.w, err)
		return err
	}
	b, _ := json.Marshal(errorBody{Error: toAPIError(err)})
	_ = s.send(append(append(append(s.buf[:0], "data: "...), b...), "\n\n"...))
	// The error event ends the reply for the official clients (npm openai
	// throws an APIError carrying its code, openai-go's stream ends with a
	// StreamError); [DONE] ends the stream cleanly for any other reader.
	_ = s.send(append(s.buf[:0], "data: [DONE]\n\n"...))
	return err
}

// deltas sends streamed tool-call deltas.
func (s *sseWriter) deltas(f *format, ds []toolDelta) error {
	for _, d := range ds {
		b, err := f.deltaChunk(d)
		if err != nil {
			return err
		}
		if err := s.send(b); err != nil {
			return err
		}
	}
	return nil
}
