package httpbackend_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// TestBalancerResumesOverHTTP: two mlxserving upstreams behind
// WithResume backends; the one serving a seeded, penalised stream drops
// its connections after tokens reached the caller, and the balancer
// resumes the stream on the other with the delivered token ids, at once
// (the reset ends the stream): the caller gets the uninterrupted tokens
// and text. Without WithResume (a
// foreign upstream, ids unknown) the stream ends with an
// *retry.InterruptedError, and a request carrying Resume is refused.
func TestBalancerResumesOverHTTP(t *testing.T) {
	step := []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)}
	ups := map[string]*upstream{"a": newUpstream(t, step), "b": newUpstream(t, step)}
	req := api.Request{Model: "tiny", Prompt: "Once upon a time", Params: api.Params{MaxTokens: 40, IgnoreEOS: true,
		Sampling: engine.SamplingParams{Temperature: 0.9, Seed: 4, HasSeed: true, FrequencyPenalty: 0.5}}}
	st, err := ups["a"].srv.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	want, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}

	for _, resume := range []bool{true, false} {
		lb, err := balancer.New(balancer.WithStrategy(balancer.RoundRobin()))
		if err != nil {
			t.Fatal(err)
		}
		defer lb.Close()
		for name, u := range ups {
			var opts []httpbackend.Option
			if resume {
				opts = append(opts, httpbackend.WithResume())
			}
			b := newBackend(t, u.ts.URL, opts...)
			if err := b.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := lb.Add(name, b); err != nil {
				t.Fatal(err)
			}
		}
		st, err := lb.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		var got api.Result
		var rerr error
		chunks := 0
		for c, err := range st.Chunks() {
			if err != nil {
				rerr = err
				break
			}
			got.Text += c.Text
			if c.HasToken {
				got.Tokens = append(got.Tokens, c.Token)
			}
			if chunks++; chunks == 5 {
				ups[st.Header().Backend].ts.CloseClientConnections() // the upstream dies mid-stream
			}
			if c.Usage != nil {
				got.Usage = *c.Usage
			}
		}
		st.Close()
		var ie *retry.InterruptedError
		switch {
		case resume && (rerr != nil || got.Text != want.Text || !slices.Equal(got.Tokens, want.Tokens) || got.Usage.Resumes != 1):
			t.Errorf("with WithResume: %v, tokens %v (usage %+v); uninterrupted %v", rerr, got.Tokens, got.Usage, want.Tokens)
		case resume && got.Usage.ResumeGap > time.Second:
			// A reset connection ends the stream at once: the gap is the
			// new request's prefill, not a timeout (loose on a loaded
			// machine; BENCHMARKS.md has the figures).
			t.Errorf("with WithResume: resume gap %v, want the reset noticed at once", got.Usage.ResumeGap)
		case !resume && !errors.As(rerr, &ie):
			t.Errorf("without WithResume: %v, want an InterruptedError", rerr)
		}
	}
	b := newBackend(t, ups["a"].ts.URL)
	resumed := req
	resumed.Resume = []int32{5}
	if _, err := b.Generate(context.Background(), resumed); !errors.Is(err, httpbackend.ErrNoResume) {
		t.Errorf("Resume without WithResume: %v, want ErrNoResume", err)
	}
}
