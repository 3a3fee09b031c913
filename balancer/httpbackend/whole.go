package httpbackend

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// maxWhole bounds a non-streamed response body.
const maxWhole = 16 << 20

// wholeResponse reads a non-streamed completion or chat completion, from
// an upstream that ignored stream:true, as a source of one text chunk and
// the final chunk.
func wholeResponse(b []byte, begun time.Time) (*wholeSource, error) {
	if len(b) > maxWhole {
		return nil, protocolError("response body above 16 MiB", nil)
	}
	var r struct {
		Choices []struct {
			Text    *string `json:"text"`
			Message *struct {
				Content *string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *usage `json:"usage"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) == 0 || r.Choices[0].FinishReason == "" {
		return nil, protocolError("response is neither an event stream nor a finished completion", b)
	}
	c := r.Choices[0]
	var text string
	switch {
	case c.Text != nil:
		text = *c.Text
	case c.Message != nil && c.Message.Content != nil:
		text = *c.Message.Content
	}
	u := &api.Usage{}
	if r.Usage != nil {
		u = r.Usage.toAPI()
	}
	u.Duration = time.Since(begun)
	u.TimeToFirstToken = u.Duration
	var chunks []api.Chunk
	if text != "" {
		chunks = append(chunks, api.Chunk{Text: text})
	}
	chunks = append(chunks, api.Chunk{Finish: api.FinishReason(c.FinishReason), Usage: u})
	return &wholeSource{chunks: chunks}, nil
}

// wholeSource replays a response already read.
type wholeSource struct {
	mu     sync.Mutex
	chunks []api.Chunk
	err    error
}

func (s *wholeSource) Recv(context.Context) (api.Chunk, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return api.Chunk{}, s.err
	}
	if len(s.chunks) == 0 {
		return api.Chunk{}, io.EOF
	}
	c := s.chunks[0]
	s.chunks = s.chunks[1:]
	return c, nil
}

func (s *wholeSource) Close(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && len(s.chunks) > 0 {
		if err == nil {
			err = context.Canceled
		}
		s.err = err
	}
}
