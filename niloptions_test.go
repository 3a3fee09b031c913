package mlxserving_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/session"
)

// TestNilOptionsAreSkipped: no constructor panics on (or refuses) a nil
// option; options that carry other packages' options pass nil ones on to
// be skipped there, also later (a batcher starts at the first load).
func TestNilOptionsAreSkipped(t *testing.T) {
	sim, err := enginetest.NewSim(nil, enginetest.WithVocabSize(1000), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(sim, nil, mlxserving.WithBatcherOptions(nil, batcher.WithMaxBatch(4), nil),
		mlxserving.WithSessionOptions(nil), mlxserving.WithPrefixCacheOptions(nil), mlxserving.WithManagerOptions(nil),
		mlxserving.WithMerging(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "sim"}); err != nil {
		t.Fatal(err)
	}
	st, err := srv.Generate(context.Background(), api.Request{Model: "sim", PromptTokens: []int32{1, 2}, Params: api.Params{MaxTokens: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collect(); err != nil {
		t.Fatal(err)
	}
	checks := map[string]func() error{
		"merge.New": func() error { _, err := merge.New(nil); return err },
		"balancer.New": func() error {
			lb, err := balancer.New(nil)
			if err == nil {
				_ = lb.Close()
			}
			return err
		},
		"scheduler.New":    func() error { _, err := scheduler.New[int](nil); return err },
		"retry.NewPolicy":  func() error { _, err := retry.NewPolicy(nil); return err },
		"retry.NewBreaker": func() error { _, err := retry.NewBreaker("b", nil); return err },
		"session.New": func() error {
			r, err := session.New(nil)
			if err == nil {
				r.Close()
			}
			return err
		},
		"httpbackend.New": func() error {
			b, err := httpbackend.New("http://127.0.0.1:1", nil)
			if err == nil {
				_ = b.Close()
			}
			return err
		},
		"openai.New":  func() error { _, err := openai.New(srv, nil); return err },
		"prewarm.New": func() error { _, err := prewarm.New(srv, nil, nil); return err },
	}
	for name, f := range checks {
		if err := f(); err != nil {
			t.Errorf("%s with a nil option: %v", name, err)
		}
	}
}

// TestOneClosedSentinel: every package's closed error wraps
// engine.ErrClosed, so the HTTP status (503), the retry classification and
// the breakers treat a closed component alike wherever it sits.
func TestOneClosedSentinel(t *testing.T) {
	for name, err := range map[string]error{
		"mlxserving": mlxserving.ErrServerClosed, "batcher": batcher.ErrClosed, "scheduler": scheduler.ErrClosed, "balancer": balancer.ErrClosed,
		"prewarm": prewarm.ErrClosed, "session": session.ErrClosed, "merge": merge.ErrClosed,
		"httpbackend": httpbackend.ErrClosed, "natsbackend": natsbackend.ErrClosed,
	} {
		if !errors.Is(err, engine.ErrClosed) {
			t.Errorf("%s.ErrClosed (%v) does not wrap engine.ErrClosed", name, err)
		}
	}
}

// TestBadOptionsRefusedAtNew: options the Server uses only at each model
// load (the batcher's, the prefix cache's) are checked by New, and so are
// batcher options that contradict each other whatever the model.
func TestBadOptionsRefusedAtNew(t *testing.T) {
	sim, err := enginetest.NewSim()
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	for name, opt := range map[string]mlxserving.Option{
		"batcher":      mlxserving.WithBatcherOptions(batcher.WithTokenBudget(0)),
		"batch limits": mlxserving.WithBatcherOptions(batcher.WithMaxBatch(4), batcher.WithTargetStepLatency(time.Millisecond, 8)),
		"prefix cache": mlxserving.WithPrefixCacheOptions(session.WithBlockSize(-1)),
	} {
		if srv, err := mlxserving.New(sim, opt); err == nil {
			_ = srv.Close()
			t.Errorf("%s: a bad option was accepted by New", name)
		}
	}
}
