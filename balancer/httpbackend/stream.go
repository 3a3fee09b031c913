package httpbackend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/retry"
)

// event is one streamed chunk of a completion or chat completion.
type event struct {
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string         `json:"finish_reason"`
		Logprobs     json.RawMessage `json:"logprobs"`
		TokenIDs     []int32         `json:"token_ids"` // return_token_ids (WithResume)
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ForcedTokens int `json:"forced_tokens"`
	} `json:"completion_tokens_details"`
}

// source reads one upstream response's server-sent events as an
// api.Source. Recv is called from one goroutine at a time; Close may run
// concurrently with it.
type source struct {
	url     string
	body    io.ReadCloser
	r       *bufio.Reader
	cancel  context.CancelFunc
	begun   time.Time
	maxLine int
	onEnd   sync.Once
	ended   func()

	readMu sync.Mutex // held while Recv reads the body
	mu     sync.Mutex
	closed bool
	err    error // the terminal error (io.EOF after the final chunk)

	data      []byte
	delivered int
	finish    api.FinishReason
	usage     *api.Usage
	firstAt   time.Duration
}

func newSource(url string, body io.ReadCloser, cancel context.CancelFunc, begun time.Time, maxLine int, onEnd func()) *source {
	return &source{url: url, body: body, r: bufio.NewReaderSize(body, min(maxLine, 64<<10)), cancel: cancel,
		begun: begun, maxLine: maxLine, ended: onEnd}
}

// Recv returns the next chunk of text, then the final chunk with the
// finish reason and usage, then io.EOF.
func (s *source) Recv(ctx context.Context) (api.Chunk, error) {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	for {
		s.mu.Lock()
		err, closed := s.err, s.closed
		s.mu.Unlock()
		if err != nil {
			return api.Chunk{}, err
		}
		if closed {
			return api.Chunk{}, context.Canceled
		}
		c, ok, err := s.next(ctx)
		if err != nil {
			s.mu.Lock()
			if s.closed { // Close cancelled the read
				err = context.Canceled
			}
			s.mu.Unlock()
			return api.Chunk{}, s.end(err)
		}
		if ok {
			if c.Finish != "" {
				s.end(io.EOF)
			}
			return c, nil
		}
	}
}

// next reads one event. ok is false for events that carry nothing for the
// caller (a role chunk, a finish chunk whose usage follows).
func (s *source) next(ctx context.Context) (api.Chunk, bool, error) {
	data, err := s.readEvent()
	switch {
	case err != nil && ctx.Err() != nil:
		return api.Chunk{}, false, ctx.Err()
	case errors.Is(err, io.EOF):
		if s.finish != "" { // an upstream that ends without [DONE]
			return s.final(), true, nil
		}
		return api.Chunk{}, false, s.broken(ErrTruncated)
	case err != nil:
		return api.Chunk{}, false, s.broken(err)
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		if s.finish == "" {
			return api.Chunk{}, false, s.broken(ErrTruncated)
		}
		return s.final(), true, nil
	}
	var ev event
	if err := json.Unmarshal(data, &ev); err != nil {
		return api.Chunk{}, false, s.broken(protocolError("event is not JSON", data))
	}
	if len(ev.Error) > 0 && !bytes.Equal(ev.Error, []byte("null")) {
		return api.Chunk{}, false, s.broken(streamError(ev.Error))
	}
	if ev.Usage != nil {
		s.usage = ev.Usage.toAPI()
	}
	var c api.Chunk
	for _, ch := range ev.Choices {
		switch {
		case ch.Text != nil:
			c.Text += *ch.Text
		case ch.Delta != nil && ch.Delta.Content != nil:
			c.Text += *ch.Delta.Content
		}
		if lp, ok := logprob(ch.Logprobs); ok {
			c.Logprob = lp
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			s.finish = api.FinishReason(*ch.FinishReason)
		}
		if len(ch.TokenIDs) == 1 {
			c.Token, c.HasToken = ch.TokenIDs[0], true
		}
	}
	if c.Text == "" && !c.HasToken {
		return c, false, nil
	}
	if s.delivered == 0 {
		s.firstAt = time.Since(s.begun)
	}
	s.delivered++
	return c, true, nil
}

// final is the last chunk: the finish reason and the usage, with the
// times measured here (as the caller saw them) where the upstream sent
// none.
func (s *source) final() api.Chunk {
	u := s.usage
	if u == nil {
		u = &api.Usage{}
	}
	u.TimeToFirstToken, u.Duration = s.firstAt, time.Since(s.begun)
	return api.Chunk{Finish: s.finish, Usage: u}
}

// broken is the error a stream failing with cause ends with: an *Error
// (retry-safe) while no text reached the caller, a
// *retry.InterruptedError after.
func (s *source) broken(cause error) error {
	if s.delivered == 0 {
		return &Error{URL: s.url, Err: cause}
	}
	return &retry.InterruptedError{Delivered: s.delivered, Err: cause}
}

// readEvent returns the data of the next server-sent event, skipping
// comments and fields other than data.
func (s *source) readEvent() ([]byte, error) {
	s.data = s.data[:0]
	for {
		line, err := s.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && len(s.data) > 0 {
				return s.data, nil
			}
			return nil, err
		}
		if len(line) == 0 {
			if len(s.data) > 0 {
				return s.data, nil
			}
			continue
		}
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if len(s.data) > 0 {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, bytes.TrimPrefix(v, []byte(" "))...)
		}
		// Comments (":") and event/id/retry fields carry nothing here.
	}
}

// readLine returns one line without its line ending, bounded in length.
func (s *source) readLine() ([]byte, error) {
	var long []byte
	for {
		frag, err := s.r.ReadSlice('\n')
		if err == nil || (errors.Is(err, io.EOF) && len(frag) > 0) {
			if long != nil {
				frag = append(long, frag...)
			}
			return bytes.TrimRight(frag, "\r\n"), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
		long = append(long, frag...)
		if len(long) > s.maxLine {
			return nil, protocolError("event line too long", long)
		}
	}
}

// end records the stream's terminal error once and releases the response.
func (s *source) end(err error) error {
	s.mu.Lock()
	if s.err != nil {
		err = s.err
		s.mu.Unlock()
		return err
	}
	s.err = err
	s.mu.Unlock()
	s.release()
	return err
}

// Close stops the stream: it cancels the request, which makes the
// upstream stop generating, and releases the connection.
func (s *source) Close(err error) {
	s.mu.Lock()
	if s.closed || s.err != nil {
		s.closed = true
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.readMu.Lock() // wait for a Recv in progress, now unblocked
	s.readMu.Unlock()
	s.mu.Lock()
	if s.err == nil {
		s.err = err
		if s.err == nil {
			s.err = context.Canceled
		}
	}
	s.mu.Unlock()
	s.release()
}

// release cancels the request and closes the body, once.
func (s *source) release() {
	s.onEnd.Do(func() {
		s.cancel()
		_ = s.body.Close()
		if s.ended != nil {
			s.ended()
		}
	})
}

func (u *usage) toAPI() *api.Usage {
	out := &api.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
	if u.PromptTokensDetails != nil {
		out.CachedTokens = u.PromptTokensDetails.CachedTokens
	}
	if u.CompletionTokensDetails != nil {
		out.ForcedTokens = u.CompletionTokensDetails.ForcedTokens
	}
	return out
}

// logprob reads the sampled token's logprob from a chunk's logprobs, in
// the chat shape ({"content":[{"logprob":x}]}) or the completions shape
// ({"token_logprobs":[x]}).
func logprob(raw json.RawMessage) (float32, bool) {
	if len(raw) == 0 || raw[0] != '{' {
		return 0, false
	}
	var lp struct {
		Content []struct {
			Logprob float64 `json:"logprob"`
		} `json:"content"`
		TokenLogprobs []float64 `json:"token_logprobs"`
	}
	if json.Unmarshal(raw, &lp) != nil {
		return 0, false
	}
	switch {
	case len(lp.Content) > 0:
		return float32(lp.Content[len(lp.Content)-1].Logprob), true
	case len(lp.TokenLogprobs) > 0:
		return float32(lp.TokenLogprobs[len(lp.TokenLogprobs)-1]), true
	}
	return 0, false
}

func streamError(raw json.RawMessage) *StreamError {
	var f errorFields
	if raw[0] == '{' && json.Unmarshal(raw, &f) == nil {
		code, param, context := f.details()
		return &StreamError{Type: f.Type, Code: code, Param: param, Message: f.Message, Context: context}
	}
	var msg string
	_ = json.Unmarshal(raw, &msg)
	return &StreamError{Message: msg}
}
