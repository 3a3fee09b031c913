package pyproc

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// python is the interpreter with torch that scripts/setup.d/30-python.sh
// installed. Without it the tests skip, unless CI is set.
func python(t testing.TB) string {
	t.Helper()
	p := os.Getenv("MLXSERVING_PYTHON")
	if p == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	return p
}

var (
	tinyOnce sync.Once
	tinyDir  string
	tinyErr  error
)

// tiny writes the default test checkpoint once per test binary.
func tiny(t testing.TB) string {
	t.Helper()
	tinyOnce.Do(func() {
		tinyDir, tinyErr = os.MkdirTemp("", "pyproc-tiny-")
		if tinyErr == nil {
			tinyErr = testmodel.Write(tinyDir, testmodel.Tiny())
		}
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyDir
}

// newEngine starts an engine for a test and closes it at the end.
func newEngine(t testing.TB, opts ...Option) *Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	device := os.Getenv("MLXSERVING_TEST_DEVICE") // cuda: the same tests on a GPU
	if device == "" {
		device = "cpu"
	}
	base := []Option{WithPython(python(t)), WithCacheDir(t.TempDir()), WithDevice(device), WithThreads(1)}
	if device != "cpu" { // the tests' tolerances are float32's
		base = append(base, WithDType("float32"))
	}
	e, err := New(ctx, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func load(t testing.TB, e *Engine, dir string) *Model {
	t.Helper()
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*Model)
}

var greedy = &engine.SamplingParams{}

// generate opens seq, feeds the prompt and decodes n tokens greedily,
// alone.
func generate(t testing.TB, m *Model, seq engine.SeqID, prompt []int32, n int) []int32 {
	t.Helper()
	ctx := context.Background()
	feed := openFeed(t, m, seq, prompt)
	defer m.Free(seq, "")
	var out []int32
	for len(out) < n {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o[0].Token)
		feed = []int32{o[0].Token}
	}
	return out
}

// openFeed opens seq without a prefix key and returns the prompt tokens
// to feed: those past the full blocks the prefix cache reused.
func openFeed(t testing.TB, m engine.Model, seq engine.SeqID, prompt []int32) []int32 {
	t.Helper()
	r, err := m.Open(context.Background(), seq, prompt, "")
	if err != nil {
		t.Fatal(err)
	}
	return prompt[r:]
}

func prompt(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*131 + i*37 + 11) % 379)
	}
	return p
}
