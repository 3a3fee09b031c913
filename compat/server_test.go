package compat_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startServer serves the project's test checkpoint (real tokenizer and
// chat template) on the simulated engine behind the OpenAI handler, on a
// loopback port. It returns the base URL (without /v1).
func startServer(t *testing.T, opts ...openai.Option) string {
	t.Helper()
	return startServerWith(t, nil, nil, opts...)
}

// startServerWith is startServer with more simulated-engine and Server
// options (a step time, deadlines).
func startServerWith(t *testing.T, simOpts []enginetest.SimOption, srvOpts []mlxserving.Option, opts ...openai.Option) string {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	return startServerAt(t, dir, simOpts, srvOpts, opts...)
}

// startServerAt is startServerWith serving the checkpoint in dir, the
// test model's shape with its files changed.
func startServerAt(t *testing.T, dir string, simOpts []enginetest.SimOption, srvOpts []mlxserving.Option, opts ...openai.Option) string {
	t.Helper()
	base, _ := serveAt(t, dir, simOpts, srvOpts, opts...)
	return base
}

// startServerEmbed is startServer that also returns the Server, to
// compare what clients get with what it answers in process.
func startServerEmbed(t *testing.T) (string, *mlxserving.Server) {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	return serveAt(t, dir, nil, nil)
}

// serveAt serves the checkpoint in dir and returns the base URL and the
// Server.
func serveAt(t *testing.T, dir string, simOpts []enginetest.SimOption, srvOpts []mlxserving.Option, opts ...openai.Option) (string, *mlxserving.Server) {
	t.Helper()
	cfg := testmodel.Tiny()
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength)}, simOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(sim, srvOpts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	h, err := openai.New(srv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(func() {
		ts.Close()
		_ = srv.Close()
		_ = sim.Close()
	})
	return ts.URL, srv
}
