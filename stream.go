package mlxserving

import (
	"context"
	"io"
	"sync"

	"github.com/mlxserving/mlxserving/api"
)

// finishedSource is the stream of a resume with nothing left to generate
// (the broken stream had delivered all of max_tokens, but not its final
// chunk): the final chunk, then the end.
type finishedSource struct {
	mu      sync.Mutex
	final   *api.Chunk
	release func()
}

func newFinishedSource(s *Server, m *model, prompt, delivered int) *finishedSource {
	return &finishedSource{
		final:   &api.Chunk{Finish: api.FinishLength, Usage: &api.Usage{PromptTokens: prompt, CompletionTokens: delivered}},
		release: sync.OnceFunc(func() { s.release(m) }),
	}
}

func (f *finishedSource) Recv(ctx context.Context) (api.Chunk, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.final == nil {
		f.release()
		return api.Chunk{}, io.EOF
	}
	c := *f.final
	f.final = nil
	return c, nil
}

func (f *finishedSource) Close(error) { f.release() }
