package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

func TestPercentileMatchesNumpy(t *testing.T) {
	s := []time.Duration{1000, 2000, 3000, 4000, 10000}
	// numpy.percentile([1,2,3,4,10], [0, 50, 90, 99, 100]) = 1, 3, 7.6, 9.76, 10
	for _, c := range []struct {
		p    float64
		want float64
	}{{0, 1}, {50, 3}, {90, 7.6}, {99, 9.76}, {100, 10}} {
		if got := float64(percentile(s, c.p)) / 1000; got < c.want-0.01 || got > c.want+0.01 {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
}

func TestSummaryDefinitions(t *testing.T) {
	ms := time.Millisecond
	results := []*result{
		{ttft: 100 * ms, e2e: 1000 * ms, outputTokens: 10, promptTokens: 5, itl: []time.Duration{100 * ms, 100 * ms}},
		{ttft: 300 * ms, e2e: 500 * ms, outputTokens: 3, promptTokens: 5},
		{ttft: 50 * ms, e2e: 50 * ms, outputTokens: 1, promptTokens: 5},
		{err: context.DeadlineExceeded},
		{err: context.DeadlineExceeded, cut: true},
	}
	s := summarize(results, 2*time.Second, slo{ttft: 200 * ms, tpot: 95 * ms}, []float64{50})
	if s.Completed != 3 || s.Failed != 1 || s.Cut != 1 || s.OutputToks != 14 || s.PromptTokens != 15 {
		t.Fatalf("counts %+v", s)
	}
	// TPOT = (e2e - ttft) / (out - 1): 100 ms and 100 ms; one-token outputs have none.
	if s.TPOT.N != 2 || s.TPOT.Mean != 100*ms {
		t.Errorf("TPOT %+v", s.TPOT)
	}
	// Goodput: the first misses tpot 95 ms, the second misses ttft, the third meets both.
	if s.GoodRequests != 1 || s.Goodput != 0.5 {
		t.Errorf("goodput %d requests, %v req/s", s.GoodRequests, s.Goodput)
	}
	if s.RequestThroughput != 1.5 || s.OutputThroughput != 7 || s.TotalThroughput != 14.5 {
		t.Errorf("throughput %v %v %v", s.RequestThroughput, s.OutputThroughput, s.TotalThroughput)
	}
	if s.ITL.N != 2 {
		t.Errorf("ITL %+v", s.ITL)
	}
}

// TestTextlessStream: a stream whose tokens decode to nothing gets its end
// as TTFT, never zero, and no TPOT; the summary counts it.
func TestTextlessStream(t *testing.T) {
	body := strings.Join([]string{
		`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}`,
		`data: {"choices":[{"delta":{"content":""},"finish_reason":"length"}]}`,
		`data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":8}}`,
		`data: [DONE]`, ``,
	}, "\n")
	r := &result{start: time.Now().Add(-time.Millisecond)}
	if err := readStream(strings.NewReader(body), r); err != nil {
		t.Fatal(err)
	}
	if !r.textless || r.ttft < time.Millisecond || r.outputTokens != 8 {
		t.Fatalf("textless %v, ttft %v, tokens %d", r.textless, r.ttft, r.outputTokens)
	}
	r.e2e = r.ttft
	s := summarize([]*result{r}, time.Second, slo{}, []float64{50})
	if s.Textless != 1 || s.TPOT.N != 0 || s.TTFT.Values[0] == 0 {
		t.Errorf("summary %+v", s)
	}
}

func TestRefusesNonLoopback(t *testing.T) {
	for _, target := range []string{"http://10.0.0.1:8080", "http://example.com", "ftp://127.0.0.1", "http://0.0.0.0:80"} {
		if _, _, _, _, err := parseFlags([]string{"-url", target}); err == nil {
			t.Errorf("%s accepted", target)
		}
	}
	for _, target := range []string{"http://127.0.0.1:1", "http://localhost:8080", "http://[::1]:8080"} {
		u, _ := url.Parse(target)
		if err := checkLoopback(u); err != nil {
			t.Errorf("%s refused: %v", target, err)
		}
	}
	for _, args := range [][]string{{"-requests", "0"}, {"-duration", "2h"}, {"-concurrency", "0"}, {"-rate", "-1"}, {"-endpoint", "x"}, {"-percentiles", "120"}, {"-inputs", "0"}, {"-temperature", "2.5"}, {"-temperature", "-1"}} {
		if _, _, _, _, err := parseFlags(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// TestAgainstServer runs the generator against the real handler on the
// simulated engine: closed loop and Poisson, streaming and not.
func TestAgainstServer(t *testing.T) {
	dir := t.TempDir()
	cfg := testmodel.Tiny()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength),
		enginetest.WithStepTime(time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv, err := mlxserving.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	h, err := openai.New(srv)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	defer ts.Close()
	for _, args := range [][]string{
		{"-requests", "20", "-concurrency", "4", "-max-tokens", "8", "-slo-ttft", "10s"},
		{"-requests", "10", "-rate", "200", "-endpoint", "completions", "-max-tokens", "5"},
		{"-requests", "5", "-stream=false", "-max-tokens", "4"},
		{"-requests", "12", "-concurrency", "4", "-endpoint", "embeddings", "-inputs", "3"},
	} {
		var out bytes.Buffer
		if err := mainErr(context.Background(), append([]string{"-url", ts.URL}, args...), &out); err != nil {
			t.Fatal(err)
		}
		report := out.String()
		for _, want := range []string{"Successful requests:", "Failed requests:                0", "Time to First Token", "Inter-token Latency", "p99"} {
			if !strings.Contains(report, want) {
				t.Errorf("%q: report lacks %q:\n%s", args, want, report)
			}
		}
		if args[len(args)-1] == "3" && !strings.Contains(report, "Embedding throughput (inputs/s)") {
			t.Errorf("embeddings: no throughput in\n%s", report)
		}
		if strings.Contains(args[len(args)-1], "10s") && !strings.Contains(report, "(20 of 20 requests met") {
			t.Errorf("goodput:\n%s", report)
		}
	}
}

// Requests take a comma-separated -model list in turn (adapters and their
// base), whatever -prompts repeats.
func TestModelsInTurn(t *testing.T) {
	cfg := config{model: "base,a,b", endpoint: "chat", inputWords: 3, maxTokens: 2, prompts: 1, seed: 1}
	for i, want := range []string{"base", "a", "b", "base"} {
		var req struct{ Model string }
		if err := json.Unmarshal(requestBody(cfg, i), &req); err != nil || req.Model != want {
			t.Fatalf("request %d: model %q (%v); want %q", i, req.Model, err, want)
		}
	}
}

// TestCutAtDuration: requests still streaming when -duration ends are
// reported as cut, not as failed, and a server error stays a failure.
func TestCutAtDuration(t *testing.T) {
	var calls atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never finishes: cut by the client's deadline
	}))
	defer ts.Close()
	var out bytes.Buffer
	err := mainErr(context.Background(), []string{"-url", ts.URL, "-model", "m", "-requests", "3", "-concurrency", "3",
		"-duration", "300ms", "-max-tokens", "4"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Successful requests:            0", "Failed requests:                1", "status 503", "Cut at -duration:               2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRamp: with -ramp the closed loop's clients start evenly over it
// (client i no earlier than i/concurrency of it), then run as a closed
// loop; -ramp with -rate or past -duration is refused.
func TestRamp(t *testing.T) {
	var (
		mu     sync.Mutex
		starts []time.Time
	)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer ts.Close()
	begin := time.Now()
	err := mainErr(context.Background(), []string{"-url", ts.URL, "-model", "m", "-requests", "8", "-concurrency", "4",
		"-ramp", "400ms", "-max-tokens", "4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 8 {
		t.Fatalf("%d requests reached the server, want 8", len(starts))
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < 4; i++ {
		if at, least := starts[i].Sub(begin), 400*time.Millisecond*time.Duration(i)/4; at < least {
			t.Errorf("client %d started %v into the run, before %v", i, at, least)
		}
	}
	for _, args := range [][]string{{"-ramp", "1s", "-rate", "5"}, {"-ramp", "-1s"}, {"-ramp", "2m"}} {
		if _, _, _, _, err := parseFlags(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// TestTemperature: -temperature rides in every generation request (0,
// greedy, by default).
func TestTemperature(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want float64
	}{{nil, 0}, {[]string{"-temperature", "1"}, 1}, {[]string{"-temperature", "0.7", "-endpoint", "completions"}, 0.7}} {
		cfg, _, _, _, err := parseFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		var req struct {
			Temperature *float64 `json:"temperature"`
		}
		if err := json.Unmarshal(requestBody(cfg, 0), &req); err != nil {
			t.Fatal(err)
		}
		if req.Temperature == nil || *req.Temperature != tc.want {
			t.Errorf("%q: temperature %v, want %v", tc.args, req.Temperature, tc.want)
		}
	}
}

// TestRangeRatio: with -range-ratio each request's prompt words and
// max_tokens are drawn within the ratio of -input-words and -max-tokens,
// both vary across requests, a request is the same in every run (its own
// seed), and without it every request asks for exactly the flags' sizes;
// ratios outside [0, 1) are refused.
func TestRangeRatio(t *testing.T) {
	sizes := func(args []string) (words, tokens []int) {
		cfg, _, _, _, err := parseFlags(append([]string{"-input-words", "20", "-max-tokens", "40", "-endpoint", "completions"}, args...))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			var req struct {
				Prompt    string `json:"prompt"`
				MaxTokens int    `json:"max_tokens"`
			}
			if err := json.Unmarshal(requestBody(cfg, i), &req); err != nil {
				t.Fatal(err)
			}
			words = append(words, len(strings.Fields(req.Prompt)))
			tokens = append(tokens, req.MaxTokens)
		}
		return words, tokens
	}
	words, tokens := sizes(nil)
	if slices.Min(words) != 20 || slices.Max(words) != 20 || slices.Min(tokens) != 40 || slices.Max(tokens) != 40 {
		t.Errorf("no ratio: words %d..%d, tokens %d..%d; want exactly 20 and 40",
			slices.Min(words), slices.Max(words), slices.Min(tokens), slices.Max(tokens))
	}
	words, tokens = sizes([]string{"-range-ratio", "0.5"})
	if slices.Min(words) < 10 || slices.Max(words) > 30 || slices.Min(tokens) < 20 || slices.Max(tokens) > 60 {
		t.Errorf("ratio 0.5: words %d..%d, tokens %d..%d; want within 10..30 and 20..60",
			slices.Min(words), slices.Max(words), slices.Min(tokens), slices.Max(tokens))
	}
	// 200 uniform draws: both ends of each range are approached.
	if slices.Max(words)-slices.Min(words) < 15 || slices.Max(tokens)-slices.Min(tokens) < 30 {
		t.Errorf("ratio 0.5: words %d..%d, tokens %d..%d; want them spread over their ranges",
			slices.Min(words), slices.Max(words), slices.Min(tokens), slices.Max(tokens))
	}
	again, againTok := sizes([]string{"-range-ratio", "0.5"})
	if !slices.Equal(words, again) || !slices.Equal(tokens, againTok) {
		t.Error("ratio 0.5: a second run drew other sizes for the same requests")
	}
	for _, r := range []string{"1", "-0.1", "NaN"} {
		if _, _, _, _, err := parseFlags([]string{"-range-ratio", r}); err == nil {
			t.Errorf("-range-ratio %s accepted", r)
		}
	}
}
