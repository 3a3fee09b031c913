package openai

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/mlxserving/mlxserving/api"
)

// maxChoices caps n.
const maxChoices = 8

// startN starts n generations of one request, one per choice. A seeded
// request gives choice i the seed plus i, so the choices differ and stay
// reproducible. The prompt is the same for all: with a session the engine
// reuses its KV across them like across turns. On error the streams
// started are closed.
func (h *Handler) startN(ctx context.Context, n int, p *api.Params, start func(context.Context, int) (*api.Stream, error)) ([]*api.Stream, error) {
	sts := make([]*api.Stream, 0, n)
	seed := p.Sampling.Seed
	for i := 0; i < n; i++ {
		if p.Sampling.HasSeed {
			p.Sampling.Seed = seed + uint64(i)
		}
		st, err := start(ctx, i)
		if err != nil {
			for _, s := range sts {
				s.Close()
			}
			return nil, err
		}
		sts = append(sts, st)
	}
	return sts, nil
}

// respondN sends n choices: one body listing them, or one SSE stream
// whose chunks carry each choice's index, usage summed at the end.
func (h *Handler) respondN(w http.ResponseWriter, r *http.Request, sts []*api.Stream, fs []*format, stream bool) {
	defer func() {
		for _, st := range sts {
			st.Close()
		}
	}()
	var err error
	if stream {
		err = h.streamN(w, sts, fs)
	} else {
		err = h.wholeN(w, sts, fs)
	}
	if err != nil && r.Context().Err() == nil {
		h.cfg.logger.Warn("request failed", "path", r.URL.Path, "model", fs[0].model, "id", fs[0].id, "err", err)
	}
}

func (h *Handler) wholeN(w http.ResponseWriter, sts []*api.Stream, fs []*format) error {
	var choices []any
	var total api.Usage
	for i, st := range sts {
		body, u, err := fs[i].collect(st)
		if err != nil {
			writeError(w, err)
			return err
		}
		choices = append(choices, body["choices"].([]any)[0])
		addUsage(&total, u)
	}
	body := fs[0].body("", nil, "", &total)
	body.(map[string]any)["choices"] = choices
	writeJSON(w, http.StatusOK, body)
	return nil
}

// addUsage sums completion tokens; the prompt is counted once.
func addUsage(total *api.Usage, u *api.Usage) {
	if u == nil {
		return
	}
	if total.PromptTokens == 0 {
		total.PromptTokens, total.CachedTokens = u.PromptTokens, u.CachedTokens
	}
	total.CompletionTokens += u.CompletionTokens
	total.ForcedTokens += u.ForcedTokens
	total.ClosingTokens += u.ClosingTokens
}

type indexed struct {
	i   int
	c   api.Chunk
	err error
}

// streamN interleaves the choices' chunks as they come.
func (h *Handler) streamN(w http.ResponseWriter, sts []*api.Stream, fs []*format) error {
	ch := make(chan indexed)
	done := make(chan struct{})
	defer close(done)
	for i, st := range sts {
		go func() {
			for {
				c, err := st.Recv()
				if errors.Is(err, io.EOF) {
					return
				}
				select {
				case ch <- indexed{i, c, err}:
				case <-done:
					return
				}
				if err != nil || c.Finish != "" {
					return
				}
			}
		}()
	}
	s := &sseWriter{w: w, rc: http.NewResponseController(w), buf: make([]byte, 0, 512)}
	var total api.Usage
	opened := make([]bool, len(sts))
	for left := len(sts); left > 0; {
		m := <-ch
		if m.err != nil {
			return s.fail(m.err)
		}
		f := fs[m.i]
		if !opened[m.i] {
			opened[m.i] = true
			if s.started && f.chat {
				if err := s.send(f.roleChunk(s.buf[:0])); err != nil {
					return err
				}
			}
		}
		usage := m.c.Usage
		if m.c.Finish != "" {
			addUsage(&total, usage)
			left--
			m.c.Usage = nil
		}
		includeUsage := f.includeUsage
		f.includeUsage = false // the summed usage goes last
		err := s.chunk(f, m.c)
		f.includeUsage = includeUsage
		if err != nil {
			return err
		}
	}
	if fs[0].includeUsage {
		if err := s.send(fs[0].usageChunk(s.buf[:0], &total)); err != nil {
			return err
		}
	}
	return s.send(append(s.buf[:0], "data: [DONE]\n\n"...))
}

// collect reads a whole stream into its response body.
func (f *format) collect(st *api.Stream) (map[string]any, *api.Usage, error) {
	var (
		text   strings.Builder
		tokens []api.Chunk
		finish api.FinishReason
		usage  *api.Usage
	)
	for c, err := range st.Chunks() {
		if err != nil {
			return nil, nil, err
		}
		text.WriteString(c.Text)
		if c.HasToken {
			f.generated++
		}
		if c.HasToken && f.logprobs {
			tokens = append(tokens, c)
		}
		if c.Finish != "" {
			finish, usage = c.Finish, c.Usage
			f.usage = c.Usage
		}
	}
	reasoning, content := f.splitReasoning(text.String())
	var body map[string]any
	if f.tools != nil {
		var (
			calls    []toolCall
			complete bool
		)
		content, calls, complete = f.tools.whole(content)
		if complete {
			finish = "tool_calls"
		}
		if len(calls) > 0 {
			body = f.toolBody(content, calls, tokens, finish, usage).(map[string]any)
		}
	}
	if body == nil {
		body = f.body(content, tokens, finish, usage).(map[string]any)
	}
	withReasoning(body, reasoning)
	return body, usage, nil
}
