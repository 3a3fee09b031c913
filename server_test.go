package mlxserving_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	sim *enginetest.Sim
	srv *mlxserving.Server
}

func newFixture(t testing.TB, simOpts []enginetest.SimOption, opts ...mlxserving.Option) *fixture {
	t.Helper()
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithContextLength(256), enginetest.WithVocabSize(1000)}, simOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(sim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "sim"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
		_ = sim.Close()
	})
	return &fixture{sim: sim, srv: srv}
}

func req(maxTokens int, prompt ...int32) api.Request {
	return api.Request{Model: "sim", PromptTokens: prompt, Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true}}
}

// waitFor polls cond: the batcher frees KV on its own goroutine, within a
// step, so tests observe it shortly after the stream ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestGenerateStreamsTokens(t *testing.T) {
	f := newFixture(t, nil)
	st, err := f.srv.Generate(context.Background(), req(12, 5, 6, 7))
	if err != nil {
		t.Fatal(err)
	}
	var tokens []int32
	var final api.Chunk
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if c.HasToken {
			tokens = append(tokens, c.Token)
		}
		if c.Finish != "" {
			final = c
		}
	}
	if len(tokens) != 12 || final.Finish != api.FinishLength || final.Usage.CompletionTokens != 12 || final.Usage.PromptTokens != 3 {
		t.Fatalf("tokens %v final %+v usage %+v", tokens, final, final.Usage)
	}
	// Greedy decoding is deterministic through the whole stack.
	st2, _ := f.srv.Generate(context.Background(), req(12, 5, 6, 7))
	res, err := st2.Collect()
	if err != nil || len(res.Tokens) != 12 {
		t.Fatal(res, err)
	}
	for i := range tokens {
		if tokens[i] != res.Tokens[i] {
			t.Fatalf("not deterministic: %v vs %v", tokens, res.Tokens)
		}
	}
}

func TestBadRequestsAreTypedAndHarmless(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0)})
	// A well-formed request runs alongside the bad ones and must finish.
	good, err := f.srv.Generate(context.Background(), req(50, 1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	long := make([]int32, 250)
	for i := range long {
		long[i] = 1
	}
	with := func(mut func(*api.Request)) api.Request {
		r := req(8, 1, 2, 3)
		mut(&r)
		return r
	}
	var ctxErr *engine.ContextLengthError
	var notFound *mlxserving.ModelNotFoundError
	tests := []struct {
		name  string
		req   api.Request
		check func(error) bool
	}{
		{"zero max tokens", with(func(r *api.Request) { r.MaxTokens = 0 }), isParam("max_tokens")},
		{"negative max tokens", with(func(r *api.Request) { r.MaxTokens = -3 }), isParam("max_tokens")},
		{"empty prompt", with(func(r *api.Request) { r.PromptTokens = nil }), isParam("prompt")},
		{"token outside vocabulary", with(func(r *api.Request) { r.PromptTokens = []int32{1, 5000} }), isParam("prompt")},
		{"unknown model", with(func(r *api.Request) { r.Model = "nope" }), func(err error) bool {
			return errors.As(err, &notFound) && errors.Is(err, engine.ErrModelNotFound)
		}},
		{"unknown tier", with(func(r *api.Request) { r.Priority = api.Tier(200) }), isParam("priority")},
		{"temperature 5", with(func(r *api.Request) { r.Sampling.Temperature = 5 }), isParam("temperature")},
		{"top_p negative", with(func(r *api.Request) { r.Sampling.TopP = -1 }), isParam("top_p")},
		{"prompt over context", with(func(r *api.Request) { r.PromptTokens = long; r.MaxTokens = 10 }), func(err error) bool {
			return errors.As(err, &ctxErr) && ctxErr.Limit == 256 && ctxErr.Prompt == 250
		}},
		{"text prompt without tokenizer", api.Request{Model: "sim", Prompt: "hi", Params: api.Params{MaxTokens: 3}}, func(err error) bool {
			return errors.Is(err, mlxserving.ErrNoTokenizer)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := f.srv.Generate(context.Background(), tt.req)
			if err == nil {
				st.Close()
				t.Fatal("accepted")
			}
			if !tt.check(err) {
				t.Fatalf("wrong error: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("empty message")
			}
		})
	}
	res, err := good.Collect()
	if err != nil || len(res.Tokens) != 50 {
		t.Fatalf("good request disturbed: %d tokens, %v", len(res.Tokens), err)
	}
}

func isParam(name string) func(error) bool {
	return func(err error) bool {
		var p *engine.InvalidParamError
		return errors.As(err, &p) && p.Param == name && errors.Is(err, engine.ErrInvalidParam)
	}
}

func TestCancelStopsGenerationAndFreesKV(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0)})
	ctx, cancel := context.WithCancel(context.Background())
	st, err := f.srv.Generate(ctx, req(200, 1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	for {
		if _, err := st.Recv(); err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("want context.Canceled, got %v", err)
			}
			break
		}
	}
	waitFor(t, "KV freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
}

func TestEarlyBreakAndAbandonedStreamsFreeTheirSlots(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0), enginetest.WithContextLength(1 << 20)})
	st, err := f.srv.Generate(context.Background(), req(200, 1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, err := range st.Chunks() {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 3 {
			break
		}
	}
	waitFor(t, "KV freed after break", func() bool { return f.sim.Stats().OpenSequences == 0 })

	// A stream dropped without Close is cancelled once it is collected.
	func() {
		if _, err := f.srv.Generate(context.Background(), req(100000, 1, 2, 3)); err != nil {
			t.Fatal(err)
		}
	}()
	waitFor(t, "abandoned stream freed", func() bool {
		return f.sim.Stats().OpenSequences == 0 && f.srv.Stats()["sim"].Batcher.Running == 0
	})
}

func TestQueueFullIsRejectedWithRetryAfter(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(time.Hour, 0), enginetest.WithMaxBatch(1)},
		mlxserving.WithSchedulerOptions(scheduler.WithMaxQueued(5)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var full *scheduler.QueueFullError
	for i := 0; ; i++ {
		_, err := f.srv.Generate(ctx, req(4, 1, 2))
		if errors.As(err, &full) {
			if full.RetryAfter <= 0 || !errors.Is(err, scheduler.ErrQueueFull) {
				t.Fatalf("bad rejection: %+v", full)
			}
			break
		}
		if err != nil || i > 10 {
			t.Fatalf("after %d requests: %v", i, err)
		}
	}
}

func TestSeveralModels(t *testing.T) {
	f := newFixture(t, nil)
	if err := f.srv.LoadModel(context.Background(), engine.ModelSpec{ID: "other"}); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.LoadModel(context.Background(), engine.ModelSpec{ID: "other"}); !errors.Is(err, mlxserving.ErrModelExists) {
		t.Fatalf("loading twice: %v", err)
	}
	var wg sync.WaitGroup
	for _, id := range []string{"sim", "other"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := req(5, 9, 9)
			r.Model = id
			st, err := f.srv.Generate(context.Background(), r)
			if err != nil {
				t.Error(err)
				return
			}
			if res, err := st.Collect(); err != nil || len(res.Tokens) != 5 {
				t.Error(id, res, err)
			}
		}()
	}
	wg.Wait()
	if got := len(f.srv.Models()); got != 2 {
		t.Fatalf("%d models", got)
	}
	if err := f.srv.UnloadModel(context.Background(), "other"); err != nil {
		t.Fatal(err)
	}
	r := req(5, 9, 9)
	r.Model = "other"
	if _, err := f.srv.Generate(context.Background(), r); !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("after unload: %v", err)
	}
}

func TestSessionReusesKV(t *testing.T) {
	f := newFixture(t, nil)
	turn1 := []int32{10, 11, 12, 13, 14, 15, 16, 17}
	r := req(4, turn1...)
	r.Session = "conv-1"
	st, _ := f.srv.Generate(context.Background(), r)
	res1, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	// The next turn's prompt starts with the whole first exchange.
	turn2 := append(append(append([]int32{}, turn1...), res1.Tokens...), 20, 21, 22)
	r2 := req(4, turn2...)
	r2.Session = "conv-1"
	st2, _ := f.srv.Generate(context.Background(), r2)
	res2, err := st2.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if res2.Usage.CachedTokens < len(turn1) {
		t.Fatalf("second turn reused %d tokens, want at least %d", res2.Usage.CachedTokens, len(turn1))
	}
}

func TestShutdownDrainsThenRefuses(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0), enginetest.WithMaxBatch(2)})
	var streams []*api.Stream
	for range 5 {
		st, err := f.srv.Generate(context.Background(), req(10, 4, 5))
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := f.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, st := range streams {
		if res, err := st.Collect(); err != nil || len(res.Tokens) != 10 {
			t.Errorf("stream %d: %d tokens, %v", i, len(res.Tokens), err)
		}
	}
	if _, err := f.srv.Generate(context.Background(), req(3, 1)); !errors.Is(err, mlxserving.ErrServerClosed) {
		t.Fatalf("after shutdown: %v", err)
	}
}

// TestResumeWithNothingLeft: a resume whose delivered tokens are all of
// max_tokens (the broken stream lost only its final chunk) ends at once
// with that chunk and the whole generation's usage; one past max_tokens
// is refused.
func TestResumeWithNothingLeft(t *testing.T) {
	f := newFixture(t, nil)
	r := req(3, 1, 2, 3, 4)
	r.Resume = []int32{7, 8, 9}
	st, err := f.srv.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil || res.Finish != api.FinishLength || len(res.Tokens) != 0 || res.Usage.CompletionTokens != 3 || res.Usage.PromptTokens != 4 {
		t.Fatalf("%+v, %v; want the final chunk alone, 3 completion tokens", res, err)
	}
	r.Resume = []int32{7, 8, 9, 10}
	if _, err := f.srv.Generate(context.Background(), r); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("a resume past max_tokens: %v, want an invalid param", err)
	}
}
