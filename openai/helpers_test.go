package openai_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a real Server on the simulated engine, loaded with the
// project's test checkpoint (so its tokenizer and chat template are real),
// behind the handler on a loopback httptest server.
type fixture struct {
	sim *enginetest.Sim
	srv *mlxserving.Server
	ts  *httptest.Server
}

type fixtureOpts struct {
	sim     []enginetest.SimOption
	server  []mlxserving.Option
	handler []openai.Option
	noModel bool
	dir     string // the checkpoint; "" writes the test model
}

func checkpoint(t testing.TB) string {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	return dir
}

// templateCheckpoint writes the test checkpoint with its chat template
// replaced.
func templateCheckpoint(t testing.TB, template string) string {
	t.Helper()
	dir := checkpoint(t)
	path := filepath.Join(dir, "tokenizer_config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = template
	b, _ = json.Marshal(cfg)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	dir := o.dir
	if dir == "" {
		dir = checkpoint(t)
	}
	cfg := testmodel.Tiny()
	simOpts := append([]enginetest.SimOption{enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength)}, o.sim...)
	sim, err := enginetest.NewSim(simOpts...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(sim, o.server...)
	if err != nil {
		t.Fatal(err)
	}
	if !o.noModel {
		if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := openai.New(srv, o.handler...)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{sim: sim, srv: srv, ts: httptest.NewServer(h)}
	t.Cleanup(func() {
		f.ts.Close()
		_ = srv.Close()
		_ = sim.Close()
	})
	return f
}

// post sends body (a string or a value to marshal) and returns the status,
// headers and body.
func (f *fixture) post(t testing.TB, path string, body any, header ...string) (int, http.Header, []byte) {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, f.ts.URL+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, out
}

func (f *fixture) get(t testing.TB, path string) (int, []byte) {
	t.Helper()
	resp, err := f.ts.Client().Get(f.ts.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t testing.TB, body []byte) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not an SSE data line", line)
		}
		events = append(events, data)
	}
	return events
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustJSON(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", b, err)
	}
	return m
}
