package balancer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
)

// TestBalancerResumesOnAnotherBackend: a backend that dies after tokens
// reached the caller is replaced mid-stream: the request goes on on
// another backend with the delivered token ids (api.Params.Resume), and
// the caller's stream is the uninterrupted generation — greedy, seeded
// and penalised — whose usage counts the resume and names the backend
// that finished.
func TestBalancerResumesOnAnotherBackend(t *testing.T) {
	for name, sp := range map[string]engine.SamplingParams{
		"greedy":            {},
		"seeded, penalised": {Temperature: 0.9, Seed: 3, HasSeed: true, PresencePenalty: 0.5, FrequencyPenalty: 0.4},
	} {
		t.Run(name, func(t *testing.T) {
			req := request("m", 40)
			req.Sampling = sp
			ref := newInstance(t, 0)
			st, err := ref.srv.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			want, err := st.Collect()
			if err != nil {
				t.Fatal(err)
			}

			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			defer mp.Shutdown(context.Background())
			lb := newBalancer(t, balancer.WithStrategy(balancer.RoundRobin()), balancer.WithMeterProvider(mp))
			backends := map[string]*instance{"a": newInstance(t, 2*time.Millisecond), "b": newInstance(t, 2*time.Millisecond)}
			for n, in := range backends {
				if err := lb.Add(n, in.srv); err != nil {
					t.Fatal(err)
				}
			}
			st, err = lb.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var got []int32
			var usage *api.Usage
			for {
				c, err := st.Recv()
				if err != nil {
					if len(got) < 40 || usage == nil {
						t.Fatalf("after %d tokens: %v", len(got), err)
					}
					break
				}
				if c.HasToken {
					got = append(got, c.Token)
				}
				if len(got) == 5 && c.HasToken {
					_ = backends[st.Header().Backend].srv.Close() // the instance dies mid-stream
				}
				if c.Usage != nil {
					usage = c.Usage
				}
			}
			if !slices.Equal(got, want.Tokens) {
				t.Errorf("resumed stream %v, uninterrupted %v", got, want.Tokens)
			}
			other := "a"
			if st.Header().Backend == "a" {
				other = "b"
			}
			if usage.Resumes != 1 || usage.Backend != other || usage.CompletionTokens != 40 || usage.PromptTokens != len(req.PromptTokens) {
				t.Errorf("usage %+v: want 1 resume, finished by %q, 40 completion tokens", usage, other)
			}
			if s := lb.Stats(); s.Resumed != 1 || s.Interrupted != 0 {
				t.Errorf("stats: resumed %d, interrupted %d; want 1, 0", s.Resumed, s.Interrupted)
			}
			m := collect(t, reader)
			from := st.Header().Backend
			if m["mlxserving.lb.resume.gap/count"] != 1 || m["mlxserving.lb.resume.gap/sum"] != usage.ResumeGap.Seconds() ||
				m["mlxserving.lb.backend.requests/backend="+from+",result=resumed"] != 1 {
				t.Errorf("metrics: %v; want one resume gap of %v, one resume from %s", m, usage.ResumeGap, from)
			}
		})
	}
}
