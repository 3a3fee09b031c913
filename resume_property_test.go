package mlxserving_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/grammar"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/retry"
)

// resumeServer serves the test checkpoint's tokenizer over a simulated
// engine with the given options; the batcher retries lost sequences
// without a wait, up to 1,000 times.
func resumeServer(t *testing.T, dir string, vocab int, opts ...enginetest.SimOption) *mlxserving.Server {
	t.Helper()
	policy := retry.MustPolicy(retry.WithMaxAttempts(1000), retry.WithBackoff(time.Microsecond, time.Microsecond, 1))
	return tokenizerServer(t, dir, append([]enginetest.SimOption{enginetest.WithVocabSize(vocab), enginetest.WithContextLength(512),
		enginetest.WithEOSProbability(0.02), enginetest.WithMaxBatch(16)}, opts...),
		mlxserving.WithBatcherOptions(batcher.WithRetryPolicy(policy), batcher.WithTokenBudget(96)))
}

// streamed is everything a caller sees of a stream.
type streamed struct {
	text     string
	tokens   []int32
	logprobs []float32
	top      [][]api.TopLogprob
	upTo     []int // len(text) after each token's chunk
	finish   api.FinishReason
	usage    api.Usage
	err      error
}

func (s *streamed) String() string {
	return fmt.Sprintf("%d tokens %v, finish %q, err %v, text %q", len(s.tokens), s.tokens, s.finish, s.err, s.text)
}

func readAll(srv *mlxserving.Server, req api.Request) *streamed {
	out := &streamed{}
	st, err := srv.Generate(context.Background(), req)
	if err != nil {
		out.err = err
		return out
	}
	defer st.Close()
	var text strings.Builder
	for c, err := range st.Chunks() {
		if err != nil {
			out.err = err
			break
		}
		text.WriteString(c.Text)
		if c.HasToken {
			out.tokens = append(out.tokens, c.Token)
			out.logprobs = append(out.logprobs, c.Logprob)
			out.top = append(out.top, c.Top)
			out.upTo = append(out.upTo, text.Len())
		}
		if c.Finish != "" {
			out.finish, out.usage = c.Finish, *c.Usage
		}
	}
	out.text = text.String()
	return out
}

// randomRequest draws a request: greedy, seeded, unseeded, with or
// without penalties, logprobs, logit bias, stop strings and a JSON schema.
// It reports whether the request's tokens are a function of the request
// (everything but unseeded sampling).
func randomRequest(r *rand.Rand) (api.Request, bool) {
	prompt := make([]int32, 2+r.IntN(30))
	for i := range prompt {
		prompt[i] = int32(3 + r.IntN(250))
	}
	p := api.Params{MaxTokens: 1 + r.IntN(48), IgnoreEOS: r.IntN(2) == 0}
	s := &p.Sampling
	deterministic := true
	switch r.IntN(5) {
	case 0: // greedy
	case 1, 2: // seeded
		s.Temperature, s.Seed, s.HasSeed = 0.3+1.2*r.Float32(), r.Uint64(), true
	case 3: // unseeded
		s.Temperature = 0.3 + 1.2*r.Float32()
		deterministic = false
	case 4: // greedy with penalties
		s.PresencePenalty, s.FrequencyPenalty = 4*r.Float32()-2, 4*r.Float32()-2
	}
	if s.Temperature > 0 && r.IntN(3) == 0 {
		s.PresencePenalty, s.FrequencyPenalty = 4*r.Float32()-2, 4*r.Float32()-2
	}
	if s.Temperature > 0 && r.IntN(3) == 0 {
		s.TopK, s.TopP, s.MinP = r.IntN(50), r.Float32(), 0.5*r.Float32()
	}
	if r.IntN(5) == 0 {
		s.RepetitionPenalty = 0.5 + r.Float32()
	}
	if r.IntN(2) == 0 {
		s.Logprobs = true
	}
	if r.IntN(4) == 0 {
		s.TopLogprobs = r.IntN(6)
	}
	if r.IntN(8) == 0 {
		s.LogitBias = map[int32]float32{int32(r.IntN(256)): 200*r.Float32() - 100, int32(r.IntN(256)): 200*r.Float32() - 100}
	}
	if r.IntN(3) == 0 {
		stops := []string{"e", "a", " ", "t", "\n", "th", "s ", "."}
		p.Stop = []string{stops[r.IntN(len(stops))]}
		if r.IntN(2) == 0 {
			p.Stop = append(p.Stop, stops[r.IntN(len(stops))])
		}
	}
	switch r.IntN(8) {
	case 0:
		p.JSONSchema = grammar.AnyObject
	case 1:
		p.JSONSchema = []byte(`{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"}},"required":["ok","n"],"additionalProperties":false}`)
	}
	// Resuming is tested on outputs the budget cuts (max_tokens down to
	// 1, below the schema's shortest document), not closes.
	p.KeepCut = p.JSONSchema != nil
	return api.Request{Model: "tiny", PromptTokens: prompt, Params: p}, deterministic
}

// TestResumeProperty: over thousands of random requests — greedy, seeded
// and unseeded sampling, presence, frequency and repetition penalties,
// logprobs, logit bias, stop strings and JSON schemas — on a simulated
// engine whose worker is lost at one step in ten, every stream ends without
// an error and equals its twin on an engine that loses nothing: tokens,
// text, logprobs, finish and usage. Unseeded streams cannot have a twin;
// they end well with a valid continuation (text that decodes from the
// tokens, a schema's document complete).
func TestResumeProperty(t *testing.T) {
	dir, tok := tinyCheckpoint(t)
	n := 3000
	if testing.Short() {
		n = 300
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d requests", seed, n)
	ref := resumeServer(t, dir, tok.VocabSize())
	lossy := resumeServer(t, dir, tok.VocabSize(), enginetest.WithWorkerLoss(0.1, seed))

	r := rand.New(rand.NewPCG(seed, 1))
	type job struct {
		req           api.Request
		deterministic bool
	}
	jobs := make([]job, n)
	for i := range jobs {
		jobs[i].req, jobs[i].deterministic = randomRequest(r)
	}
	want, got := make([]*streamed, n), make([]*streamed, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				got[i] = readAll(lossy, jobs[i].req)
				if jobs[i].deterministic {
					want[i] = readAll(ref, jobs[i].req)
				}
			}
		})
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()

	bad := 0
	for i, j := range jobs {
		g := got[i]
		var problem string
		switch {
		case g.err != nil:
			problem = fmt.Sprintf("failed: %v", g.err)
		case j.deterministic && want[i].err != nil:
			problem = fmt.Sprintf("the twin failed: %v", want[i].err)
		case j.deterministic && !sameStream(g, want[i]):
			problem = fmt.Sprintf("got %v\nwant %v", g, want[i])
		case !j.deterministic:
			problem = validContinuation(tok, j.req, g)
		}
		if problem != "" {
			bad++
			if bad <= 5 {
				t.Errorf("request %d %+v: %s", i, j.req.Params, problem)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d streams differ from their twins (seed %d)", bad, n, seed)
	}
	st := lossy.Stats()["tiny"].Batcher
	t.Logf("resumed %d times", st.Resumed)
	if st.Resumed < uint64(n/20) {
		t.Errorf("only %d resumes over %d requests: the losses do not exercise resuming", st.Resumed, n)
	}
}

// sameStream compares what a caller sees, all but times and cached
// tokens (which depend on what the prefix cache holds).
func sameStream(a, b *streamed) bool {
	return a.text == b.text && slices.Equal(a.tokens, b.tokens) && slices.Equal(a.logprobs, b.logprobs) &&
		slices.EqualFunc(a.top, b.top, slices.Equal) && a.finish == b.finish &&
		a.usage.PromptTokens == b.usage.PromptTokens && a.usage.CompletionTokens == b.usage.CompletionTokens
}

// validContinuation checks an unseeded stream: it ended well, within its
// limits, its text is its tokens' (before a stop string) and a schema's
// document is complete when it stopped.
func validContinuation(tok *tokenizer.Tokenizer, req api.Request, g *streamed) string {
	switch {
	case g.finish != api.FinishStop && g.finish != api.FinishLength:
		return fmt.Sprintf("finish %q", g.finish)
	case len(g.tokens) > req.MaxTokens || g.usage.CompletionTokens < len(g.tokens):
		return fmt.Sprintf("%d tokens (usage %d) for max %d", len(g.tokens), g.usage.CompletionTokens, req.MaxTokens)
	case g.usage.PromptTokens != len(req.PromptTokens):
		return fmt.Sprintf("usage counts %d prompt tokens, sent %d", g.usage.PromptTokens, len(req.PromptTokens))
	}
	if len(req.Stop) == 0 {
		// A character cut short by the end stays held back.
		text, err := tok.Decode(g.tokens, true)
		if err != nil || strings.TrimRight(strings.TrimPrefix(text, g.text), "\uFFFD") != "" {
			return fmt.Sprintf("text %q, its tokens decode to %q (%v)", g.text, text, err)
		}
	}
	if req.JSONSchema != nil && g.finish == api.FinishStop && len(req.Stop) == 0 && !json.Valid([]byte(g.text)) {
		return fmt.Sprintf("stopped with %q, not a JSON document", g.text)
	}
	return ""
}

// TestResumeMetrics: resumes are exported by cause, with the gap they
// added, and their count and gap reach the stream's usage.
func TestResumeMetrics(t *testing.T) {
	mp := newTestMeter(t)
	dir, tok := tinyCheckpoint(t)
	policy := retry.MustPolicy(retry.WithMaxAttempts(1000), retry.WithBackoff(time.Microsecond, time.Microsecond, 1))
	srv := tokenizerServer(t, dir, []enginetest.SimOption{enginetest.WithVocabSize(tok.VocabSize()), enginetest.WithWorkerLoss(0.2, 7)},
		mlxserving.WithMeterProvider(mp), mlxserving.WithBatcherOptions(batcher.WithRetryPolicy(policy)))
	resumes, gap := 0, time.Duration(0)
	for i := range 20 {
		g := readAll(srv, api.Request{Model: "tiny", PromptTokens: []int32{int32(10 + i), 20, 30}, Params: api.Params{MaxTokens: 20, IgnoreEOS: true}})
		if g.err != nil {
			t.Fatal(g.err)
		}
		resumes += g.usage.Resumes
		gap += g.usage.ResumeGap
	}
	var counted int64
	var gaps uint64
	var gapSum float64
	for _, m := range mp.metrics(t) {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				if v, _ := p.Attributes.Value("cause"); m.Name == "mlxserving.sequences.resumed" && v.AsString() == batcher.ResumeWorkerLost {
					counted += p.Value
				}
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				if v, _ := p.Attributes.Value("cause"); m.Name == "mlxserving.resume.gap" && v.AsString() == batcher.ResumeWorkerLost {
					gaps += p.Count
					gapSum += p.Sum
				}
			}
		}
	}
	if resumes == 0 || counted != int64(resumes) || gaps == 0 || gaps > uint64(resumes) {
		t.Errorf("%d resumes in the streams' usage; exported: %d resumes, %d gaps", resumes, counted, gaps)
	}
	if d := gapSum - gap.Seconds(); d > 1e-6 || d < -1e-6 {
		t.Errorf("exported gaps add up to %.6fs, the usage's to %v", gapSum, gap)
	}
}

// TestResumeRequestContinues: a request that carries the tokens an earlier
// attempt delivered (api.Params.Resume) streams exactly the rest of the
// uninterrupted generation — tokens, logprobs, text after what was
// delivered, finish — and reports the whole generation's usage; for
// greedy, seeded and penalised requests with stop strings and JSON
// schemas. Resume tokens after which generation would have ended are
// refused.
func TestResumeRequestContinues(t *testing.T) {
	dir, tok := tinyCheckpoint(t)
	srv := resumeServer(t, dir, tok.VocabSize())
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 2))
	tried := 0
	for i := 0; tried < 300 && i < 3000; i++ {
		req, deterministic := randomRequest(r)
		if !deterministic {
			continue
		}
		full := readAll(srv, req)
		if full.err != nil {
			t.Fatalf("request %+v: %v", req.Params, full.err)
		}
		if len(full.tokens) < 2 {
			continue
		}
		tried++
		k := 1 + r.IntN(len(full.tokens)-1)
		resumed := req
		resumed.Resume = slices.Clone(full.tokens[:k])
		got := readAll(srv, resumed)
		want := &streamed{text: full.text[full.upTo[k-1]:], tokens: full.tokens[k:], logprobs: full.logprobs[k:], top: full.top[k:],
			finish: full.finish, usage: full.usage}
		if got.err != nil || !sameStream(got, want) {
			t.Fatalf("seed %d, resumed after %d of %d tokens (%+v):\n got %v\nwant %v", seed, k, len(full.tokens), req.Params, got, want)
		}
	}
	if tried < 100 {
		t.Fatalf("only %d requests long enough to resume", tried)
	}

	// Tokens after which generation would have ended are refused.
	req := api.Request{Model: "tiny", PromptTokens: []int32{5, 6, 7}, Params: api.Params{MaxTokens: 8, IgnoreEOS: true}}
	full := readAll(srv, req)
	if full.err != nil {
		t.Fatal(full.err)
	}
	stop := req
	stop.StopTokens, stop.Resume = full.tokens[1:2], full.tokens[:3]
	all := req
	all.Resume = append(slices.Clone(full.tokens), full.tokens[0]) // past max_tokens
	outside := req
	outside.Resume = []int32{int32(tok.VocabSize())}
	for name, bad := range map[string]api.Request{"a stop token": stop, "more than max_tokens": all, "outside the vocabulary": outside} {
		if _, err := srv.Generate(context.Background(), bad); !errors.Is(err, engine.ErrInvalidParam) {
			t.Errorf("resume with %s: %v, want an invalid-param error", name, err)
		}
	}
}

// TestMergedStreamsFollowTheResume: identical seeded requests merged into
// one generation all follow it through its worker's losses: every
// subscriber gets the uninterrupted tokens.
func TestMergedStreamsFollowTheResume(t *testing.T) {
	dir, tok := tinyCheckpoint(t)
	ref := resumeServer(t, dir, tok.VocabSize())
	policy := retry.MustPolicy(retry.WithMaxAttempts(1000), retry.WithBackoff(time.Microsecond, time.Microsecond, 1))
	lossy := tokenizerServer(t, dir, []enginetest.SimOption{enginetest.WithVocabSize(tok.VocabSize()), enginetest.WithContextLength(512),
		enginetest.WithEOSProbability(0.02), enginetest.WithMaxBatch(16), enginetest.WithStepTime(time.Millisecond, 0), enginetest.WithWorkerLoss(0.2, 5)},
		mlxserving.WithMerging(), mlxserving.WithBatcherOptions(batcher.WithRetryPolicy(policy)))
	req := api.Request{Model: "tiny", PromptTokens: []int32{40, 41, 42}, Params: api.Params{MaxTokens: 40, IgnoreEOS: true,
		Sampling: engine.SamplingParams{Temperature: 0.8, Seed: 21, HasSeed: true, FrequencyPenalty: 0.5}}}
	want := readAll(ref, req)
	streams := make([]*api.Stream, 4)
	for i := range streams {
		st, err := lossy.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	merged := 0
	for i, st := range streams {
		if st.Header().Cache == "merged" {
			merged++
		}
		res, err := st.Collect()
		if err != nil || !slices.Equal(res.Tokens, want.tokens) || res.Text != want.text {
			t.Errorf("subscriber %d: %v %v, want %v", i, err, res.Tokens, want.tokens)
		}
	}
	if merged == 0 {
		t.Error("no request was merged")
	}
	if lossy.Stats()["tiny"].Batcher.Resumed == 0 {
		t.Error("the generation never resumed")
	}
}

// TestResumedRequestsGoFirst: a resumed request (its caller waiting
// mid-stream) is admitted ahead of requests of its tier that queued
// before it.
func TestResumedRequestsGoFirst(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0), enginetest.WithEOS()},
		mlxserving.WithBatcherOptions(batcher.WithMaxBatch(1)))
	ctx := context.Background()
	busy, err := f.srv.Generate(ctx, req(30, 1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if _, err := busy.Recv(); err != nil { // running: the next two queue
		t.Fatal(err)
	}
	queued, err := f.srv.Generate(ctx, req(2, 4, 5, 6))
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()
	resumed := req(3, 7, 8, 9)
	resumed.Resume = []int32{10}
	rs, err := f.srv.Generate(ctx, resumed)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	first := make(chan string, 2)
	for name, st := range map[string]*api.Stream{"queued": queued, "resumed": rs} {
		go func() {
			if _, err := st.Recv(); err == nil {
				first <- name
			} else {
				first <- name + ": " + err.Error()
			}
		}()
	}
	if got := <-first; got != "resumed" {
		t.Errorf("first token went to %q; the resumed request should run first", got)
	}
	<-first
}
