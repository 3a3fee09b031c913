package httpbackend_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
)

func greedy(n int) api.Params {
	return api.Params{MaxTokens: n, IgnoreEOS: true}
}

// TestGenerateMatchesDirect: a completion through the HTTP hop has the
// same text, finish reason and token counts as the Server's own.
func TestGenerateMatchesDirect(t *testing.T) {
	u := newUpstream(t, nil)
	b := newBackend(t, u.ts.URL)
	ctx := context.Background()
	req := api.Request{Model: "tiny", Prompt: "Once upon a time", Params: greedy(12)}
	want, err := mustStream(u.srv.Generate(ctx, req)).Collect()
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if got.Text != want.Text || got.Text == "" {
		t.Errorf("text %q, want %q", got.Text, want.Text)
	}
	if got.Finish != api.FinishLength {
		t.Errorf("finish %q, want length", got.Finish)
	}
	if got.Usage.PromptTokens != want.Usage.PromptTokens || got.Usage.CompletionTokens != 12 {
		t.Errorf("usage %+v, want prompt %d completion 12", got.Usage, want.Usage.PromptTokens)
	}
	if got.Usage.Duration <= 0 {
		t.Errorf("duration %v not measured", got.Usage.Duration)
	}
	if h := st.Header(); h.Model != "tiny" || h.Backend != u.ts.URL {
		t.Errorf("header %+v", h)
	}
}

func mustStream(st *api.Stream, err error) *api.Stream {
	if err != nil {
		panic(err)
	}
	return st
}

// TestChatForwardsPrioritySession: chat goes to /v1/chat/completions with
// the request's priority and session as headers, and a response served
// from the upstream's cache reports its cached prompt tokens.
func TestChatForwardsPrioritySession(t *testing.T) {
	u := newUpstream(t, nil, mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute)))
	b := newBackend(t, u.ts.URL)
	ctx := context.Background()
	msgs := []api.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Say hello to everyone in the room."}}
	p := greedy(6)
	p.Priority, p.Session = api.High, "conv-1"
	req := api.ChatRequest{Model: "tiny", Messages: msgs, Params: p}
	st, err := b.Chat(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	h := u.lastHeader()
	if h.Get("X-Priority") != "high" || h.Get("X-Session-ID") != "conv-1" {
		t.Errorf("headers X-Priority %q X-Session-ID %q", h.Get("X-Priority"), h.Get("X-Session-ID"))
	}
	if first.Text == "" || first.Usage.CompletionTokens != 6 {
		t.Fatalf("first turn %+v", first)
	}
	req.Session, req.Cache = "", true
	for i := range 2 {
		st, err := b.Chat(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && (res.Usage.CachedTokens != res.Usage.PromptTokens || st.Header().Cache != "hit" || res.Text != first.Text) {
			t.Errorf("cached response: usage %+v, X-Cache %q, text %q want %q", res.Usage, st.Header().Cache, res.Text, first.Text)
		}
	}
}

// TestCloseStopsUpstream: closing the stream cancels the upstream's
// generation, freeing its sequence.
func TestCloseStopsUpstream(t *testing.T) {
	u := newUpstream(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)})
	b := newBackend(t, u.ts.URL)
	st, err := b.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "hello", Params: greedy(400)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if u.sim.Stats().OpenSequences != 1 {
		t.Fatalf("open sequences %d, want 1", u.sim.Stats().OpenSequences)
	}
	st.Close()
	if _, err := st.Recv(); err == nil {
		t.Fatal("Recv after Close returned a chunk")
	}
	waitFor(t, "upstream sequence freed", func() bool { return u.sim.Stats().OpenSequences == 0 })
}

// TestLoadFromMetrics: Load reports the upstream's models and, from its
// /metrics, the sequences running.
func TestLoadFromMetrics(t *testing.T) {
	u := newUpstream(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)})
	b := newBackend(t, u.ts.URL, httpbackend.WithModels("extra"))
	if err := b.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	l := b.Load()
	if !slices.Equal(l.Models, []string{"extra", "tiny"}) || l.Running != 0 || l.Updated.IsZero() {
		t.Errorf("idle load %+v", l)
	}
	var streams []*api.Stream
	for range 3 {
		st, err := b.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "hello", Params: greedy(400)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := b.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l := b.Load(); l.Running != 3 || l.KVUsage <= 0 {
		t.Errorf("busy load %+v, want 3 running and KV in use", l)
	}
	for _, st := range streams {
		st.Close()
	}
}

// TestModelNotFound: an unknown model is a non-retryable *Error that
// classifies as engine.ErrModelNotFound.
func TestModelNotFound(t *testing.T) {
	u := newUpstream(t, nil)
	b := newBackend(t, u.ts.URL)
	_, err := b.Generate(context.Background(), api.Request{Model: "nope", Prompt: "x", Params: greedy(2)})
	var he *httpbackend.Error
	if !errors.As(err, &he) || he.Status != 404 || he.Retryable() {
		t.Fatalf("err %v, want a non-retryable 404 *Error", err)
	}
	if !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("%v does not match engine.ErrModelNotFound", err)
	}
	_, err = b.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "x", Params: api.Params{MaxTokens: 2, Sampling: engine.SamplingParams{Temperature: 1, TopK: -1}}})
	var ip *engine.InvalidParamError
	if !errors.As(err, &ip) || ip.Param != "top_k" {
		t.Errorf("err %v, want an *engine.InvalidParamError for top_k", err)
	}
}

// TestPollerFollowsLoad: the background poller, without Refresh, follows
// the upstream's load as requests start and end, and notices the
// upstream going away.
func TestPollerFollowsLoad(t *testing.T) {
	u := newUpstream(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)})
	b := newBackend(t, u.ts.URL, httpbackend.WithPollInterval(20*time.Millisecond))
	waitFor(t, "models polled", func() bool { return b.Load().Serves("tiny") })
	var streams []*api.Stream
	for range 2 {
		st, err := b.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "hello", Params: greedy(400)})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	waitFor(t, "2 running", func() bool { return b.Load().Running == 2 })
	for _, st := range streams {
		st.Close()
	}
	waitFor(t, "0 running", func() bool { return b.Load().Running == 0 })
	u.ts.Close()
	waitFor(t, "poll error", func() bool { return b.PollErr() != nil })
	if err := b.CheckHealth(context.Background()); err == nil {
		t.Error("health check of a closed upstream passed")
	}
}
