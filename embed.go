package mlxserving

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/retry"
)

// Embed returns one vector per input from a model that embeds
// (engine.Info.EmbedDim > 0): each input runs as a prefill-only sequence
// in the model's batches, beside generating requests, at the request's
// tier and under its deadlines, and is pooled as the checkpoint says
// (Info.Pooling) and L2-normalized when it normalizes. Identical inputs
// are embedded once; with WithMerging they also join identical inputs of
// other requests in flight, and with a response cache and Cache set they
// are answered from it.
//
// Bad input is refused before anything runs, with an
// *api.InvalidParamError (no inputs, too many, an empty one, dimensions
// the model does not allow, a model that does not embed) or an
// *engine.ContextLengthError (an input over the model's limit, unless
// Truncate). If ctx ends, every input's sequence is cancelled.
func (s *Server) Embed(ctx context.Context, req api.EmbedRequest) (*api.Embeddings, error) {
	start := time.Now()
	res, err := s.embed(ctx, req, start)
	s.metrics.embedded(req.Model, req.Priority, res, err)
	return res, err
}

func (s *Server) embed(ctx context.Context, req api.EmbedRequest, start time.Time) (*api.Embeddings, error) {
	switch n := len(req.Inputs); {
	case n == 0:
		return nil, &api.InvalidParamError{Param: "input", Reason: "no inputs to embed"}
	case n > api.MaxEmbedInputs:
		return nil, &api.InvalidParamError{Param: "input", Reason: fmt.Sprintf("%d inputs; at most %d per request", n, api.MaxEmbedInputs)}
	case req.Dimensions < 0:
		return nil, &api.InvalidParamError{Param: "dimensions", Reason: fmt.Sprintf("%d is negative", req.Dimensions)}
	}
	if err := req.Deadlines.Validate(); err != nil {
		return nil, &api.InvalidParamError{Param: "deadlines", Reason: err.Error()}
	}
	if _, adapter, _ := s.resolveAdapter(req.Model, ""); adapter != "" {
		return nil, &api.InvalidParamError{Param: "model", Reason: fmt.Sprintf("%q is a LoRA adapter: adapters generate and do not embed", req.Model)}
	}
	m, err := s.acquire(ctx, req.Model, nil)
	if err != nil {
		return nil, err
	}
	defer s.release(m)
	if err := checkDimensions(m.info, req.Dimensions); err != nil {
		return nil, err
	}
	inputs, err := s.embedInputs(m, req)
	if err != nil {
		return nil, err
	}
	// Identical inputs run once.
	unique := make(map[string]int, len(inputs))
	var jobs []*embedJob
	order := make([]*embedJob, len(inputs))
	for i, in := range inputs {
		key := tokenKey(in)
		j, ok := unique[key]
		if !ok {
			j = len(jobs)
			unique[key] = j
			jobs = append(jobs, &embedJob{tokens: in})
		}
		order[i] = jobs[j]
	}
	res := &api.Embeddings{Model: m.info.ID, Vectors: make([][]float32, len(inputs))}
	if err := s.runEmbedJobs(ctx, m, req, jobs); err != nil {
		return nil, err
	}
	for i, j := range order {
		res.Vectors[i] = finishVector(j.vec, req.Dimensions, m.info.Normalize)
		res.PromptTokens += len(j.tokens)
		if j.cached || j.served {
			res.Cached++
		}
		j.served = true // a repeated input counts as cached
	}
	res.Duration = time.Since(start)
	return res, nil
}

// embedJob is one distinct input of an Embed request.
type embedJob struct {
	tokens []int32
	src    api.Source
	vec    []float32
	cached bool // answered by the response cache or an identical input in flight
	served bool // its vector went to an input of the request already
}

// checkDimensions refuses a Dimensions the model does not allow.
func checkDimensions(info engine.Info, dims int) error {
	switch {
	case info.EmbedDim == 0:
		return &api.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q does not embed", info.ID)}
	case dims == 0 || dims == info.EmbedDim:
		return nil
	case dims > info.EmbedDim:
		return &api.InvalidParamError{Param: "dimensions", Reason: fmt.Sprintf("%d is more than model %q's %d", dims, info.ID, info.EmbedDim)}
	case !info.Matryoshka:
		return &api.InvalidParamError{Param: "dimensions",
			Reason: fmt.Sprintf("model %q does not say its vectors may be truncated (no is_matryoshka or matryoshka_dimensions in its config.json)", info.ID)}
	case len(info.MatryoshkaDims) > 0 && !slices.Contains(info.MatryoshkaDims, dims):
		return &api.InvalidParamError{Param: "dimensions", Reason: fmt.Sprintf("model %q was trained for %v dimensions, not %d", info.ID, info.MatryoshkaDims, dims)}
	}
	return nil
}

// embedInputs tokenizes and checks every input, truncating those over
// the model's limit when req.Truncate.
func (s *Server) embedInputs(m *model, req api.EmbedRequest) ([][]int32, error) {
	limit := m.info.ContextLength
	out := make([][]int32, len(req.Inputs))
	for i, in := range req.Inputs {
		param := fmt.Sprintf("input[%d]", i)
		toks := in.Tokens
		if len(toks) == 0 {
			if in.Text == "" {
				return nil, &api.InvalidParamError{Param: param, Reason: "the input is empty"}
			}
			if m.tok == nil {
				return nil, fmt.Errorf("%w: model %q takes token ids", ErrNoTokenizer, m.info.ID)
			}
			var err error
			if req.Truncate {
				// The text's own tokens are cut, then the special tokens
				// added: a BERT input still ends with [SEP].
				toks, _, err = m.tok.EncodeTruncated(in.Text, limit)
			} else {
				toks, err = m.tok.Encode(in.Text, true)
			}
			if err != nil {
				return nil, &api.InvalidParamError{Param: param, Reason: err.Error(), Err: err}
			}
			if len(toks) == 0 {
				return nil, &api.InvalidParamError{Param: param, Reason: "the input has no tokens"}
			}
		}
		for _, t := range toks {
			if t < 0 || int(t) >= m.info.VocabSize {
				return nil, &api.InvalidParamError{Param: param, Reason: fmt.Sprintf("token id %d is outside the vocabulary of %d", t, m.info.VocabSize)}
			}
		}
		if len(toks) > limit {
			if !req.Truncate {
				return nil, &engine.ContextLengthError{Model: m.info.ID, Prompt: len(toks), Limit: limit}
			}
			toks = toks[:limit:limit] // token ids are used as given
		}
		out[i] = toks
	}
	return out, nil
}

// tokenKey is a map key of a token sequence.
func tokenKey(toks []int32) string {
	b := make([]byte, 4*len(toks))
	for i, t := range toks {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
	}
	return string(b)
}

// runEmbedJobs queues every job's sequence and waits for their vectors.
// On any error it cancels them all.
func (s *Server) runEmbedJobs(ctx context.Context, m *model, req api.EmbedRequest, jobs []*embedJob) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() {
		for _, j := range jobs {
			if j.src != nil {
				j.src.Close(err) // nil after a vector: a no-op on a finished source
			}
		}
	}()
	submitted := time.Now()
	for i, j := range jobs {
		client := req.Client
		if i > 0 {
			client = "" // the request counts once against the client's rate
		}
		if j.src, err = s.startEmbed(ctx, m, req, j, client, submitted); err != nil {
			return err
		}
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			if errs[i] = j.receive(ctx); errs[i] != nil {
				cancel() // the request fails: stop the others
			}
		})
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil && !errors.Is(e, context.Canceled) {
			return e
		}
	}
	return errors.Join(errs...) // the callers' cancellations
}

// receive reads the job's vector from its source.
func (j *embedJob) receive(ctx context.Context) error {
	for {
		c, err := j.src.Recv(ctx)
		if errors.Is(err, io.EOF) {
			if j.vec == nil {
				return errors.New("the embedding ended without a vector")
			}
			return nil
		}
		if err != nil {
			return err
		}
		if c.Embedding != nil {
			j.vec = c.Embedding
		}
	}
}

// startEmbed queues one input's sequence, through the merger when merging
// is on.
func (s *Server) startEmbed(ctx context.Context, m *model, req api.EmbedRequest, j *embedJob, client string, submitted time.Time) (api.Source, error) {
	start := func(fctx context.Context, tier api.Tier) (api.Source, error) {
		src, err := s.queueEmbed(fctx, m, req.Deadlines, j.tokens, tier, client, submitted)
		if err != nil {
			return nil, err // not a nil *batcher.Source in a non-nil api.Source
		}
		return src, nil
	}
	if s.merger == nil || !req.Deadlines.Zero() {
		return start(ctx, req.Priority)
	}
	k := merge.KeyOf(merge.Request{Model: m.info.ID, Revision: m.revision, Prompt: j.tokens, Pooling: m.info.Pooling})
	src, outcome, err := s.merger.Join(ctx, k, req.Priority, req.Cache, start)
	j.cached = outcome == merge.Hit || outcome == merge.Merged
	return src, err
}

// queueEmbed pushes one embedding sequence onto the model's queue.
func (s *Server) queueEmbed(ctx context.Context, m *model, deadlines api.Deadlines, toks []int32, tier api.Tier, client string, submitted time.Time) (*batcher.Source, error) {
	seq := &batcher.Sequence{Prompt: toks, Pool: m.info.Pooling, Tier: tier, Submitted: submitted}
	entry := &batcher.Entry{Value: seq, Tier: tier, Client: client, Cost: len(toks)}
	if d := deadlines.Or(s.requestDeadlines(ctx)); !d.Zero() {
		seq.Watch = retry.NewWatch(d, submitted, func(err *retry.DeadlineError) { batcher.Expire(m.queue, entry, err) })
	}
	if err := m.queue.Push(entry); err != nil {
		seq.Watch.Stop()
		return nil, err
	}
	m.active.Add(1) // released when the sequence ends, also unread
	release := sync.OnceFunc(func() { s.release(m) })
	go releaseWhenDone(release, seq.Done())
	return batcher.NewSource(ctx, entry, m.queue, batcher.SourceHooks{End: func(*api.Usage, error) { release() }}), nil
}

// finishVector copies v, truncated to dims values (0: all) and
// L2-normalized when normalize is set.
func finishVector(v []float32, dims int, normalize bool) []float32 {
	if dims > 0 && dims < len(v) {
		v = v[:dims]
	}
	out := slices.Clone(v)
	if !normalize {
		return out
	}
	var sum float64
	for _, x := range out {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return out
	}
	inv := 1 / math.Sqrt(sum)
	for i, x := range out {
		out[i] = float32(float64(x) * inv)
	}
	return out
}
