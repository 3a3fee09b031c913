package natsbackend_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestResumeAcrossInstances: in a 3-instance cluster, the instance serving
// a stream dies after tokens reached the caller (its service stops, or
// its connection drops); the balancer resumes the stream on another
// instance with the delivered token ids, which cross NATS in the request
// (api.Params.Resume), and the caller gets the uninterrupted generation's
// tokens and text — greedy, and seeded with penalties.
func TestResumeAcrossInstances(t *testing.T) {
	n := startNATS(t)
	step := enginetest.WithStepTime(5*time.Millisecond, 0)
	instances := map[string]*instance{}
	for _, name := range []string{"a", "b", "c"} {
		instances[name] = startInstance(t, n, name, step)
	}
	lb, d := newBalancer(t, n)
	waitInstances(t, d, "a", "b", "c")
	ref := startInstance(t, n, "reference")
	_ = ref.svc.Stop() // served directly, never found

	for _, tc := range []struct {
		name string
		p    engine.SamplingParams
		kill func(*instance)
	}{
		{"greedy, service stopped", engine.SamplingParams{}, func(in *instance) { _ = in.svc.Stop() }},
		{"seeded and penalised, connection dropped", engine.SamplingParams{Temperature: 0.9, Seed: 9, HasSeed: true, PresencePenalty: 0.6, FrequencyPenalty: 0.3},
			func(in *instance) { in.nc.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := genReq(60)
			req.Sampling = tc.p
			st, err := ref.srv.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			want, err := st.Collect()
			if err != nil {
				t.Fatal(err)
			}
			st, err = lb.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var got api.Result
			for c, err := range st.Chunks() {
				if err != nil {
					t.Fatalf("after %d tokens: %v", len(got.Tokens), err)
				}
				got.Text += c.Text
				if c.HasToken {
					got.Tokens = append(got.Tokens, c.Token)
					if len(got.Tokens) == 5 {
						tc.kill(instances[st.Header().Backend])
					}
				}
				if c.Usage != nil {
					got.Usage = *c.Usage
				}
			}
			if got.Text != want.Text || !slices.Equal(got.Tokens, want.Tokens) {
				t.Errorf("resumed: %d tokens %q; uninterrupted: %d tokens %q", len(got.Tokens), got.Text, len(want.Tokens), want.Text)
			}
			// One resume at least. More are the heartbeat check at work: on a
			// loaded machine (CI runs packages side by side, under -race) the
			// resumed stream's instance can send its heartbeats late, be
			// taken for lost ("instance stopped answering") and the stream
			// resumed again; the tokens above must match either way.
			if got.Usage.Resumes < 1 || got.Usage.Backend == st.Header().Backend || got.Usage.CompletionTokens != 60 {
				t.Errorf("usage %+v: want a resume, finished elsewhere than %s, 60 completion tokens", got.Usage, st.Header().Backend)
			}
			if got.Usage.Resumes > 1 {
				t.Logf("%d resumes (missed heartbeats on a loaded machine), resume gap %v", got.Usage.Resumes, got.Usage.ResumeGap)
			}
		})
	}
}
