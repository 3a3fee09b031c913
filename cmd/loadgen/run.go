package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// config is one run's workload.
type config struct {
	target      *url.URL
	endpoint    string // "chat", "completions" or "embeddings"
	inputs      int    // texts per embeddings request
	model       string
	requests    int
	duration    time.Duration
	prompts     int // distinct prompts repeated in turn; 0: every request its own
	concurrency int
	rate        float64       // Poisson arrivals per second; 0 is closed loop
	ramp        time.Duration // closed loop: the clients start evenly over it (0: all at once)
	inputWords  int
	maxTokens   int
	rangeRatio  float64 // each request's words and tokens uniform within ±rangeRatio of inputWords and maxTokens
	stream      bool
	temperature float64 // sampling temperature sent with every request (0: greedy)
	priority    string
	seed        uint64
}

// checkLoopback refuses targets other than this machine.
func checkLoopback(u *url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("target %q: scheme must be http or https", u)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("target %q: only loopback hosts (127.0.0.1, ::1, localhost) are allowed", u)
	}
	return nil
}

// run replays the workload and returns one result per request sent, the
// whole run's time and the time over which requests were sent (to the
// last send). It stops after cfg.requests requests or cfg.duration,
// whichever is first; requests in flight at the deadline are cancelled
// and counted apart (result.cut), not as failed.
func run(ctx context.Context, client *http.Client, cfg config) ([]*result, time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	rng := rand.New(rand.NewPCG(cfg.seed, 0x6c6f6164))
	var (
		mu      sync.Mutex
		results []*result
		wg      sync.WaitGroup
	)
	slots := make(chan struct{}, cfg.concurrency)
	start := time.Now()
	next := start
	var sending time.Duration
	for i := 0; i < cfg.requests; i++ {
		if cfg.rate > 0 {
			next = next.Add(time.Duration(rng.ExpFloat64() / cfg.rate * float64(time.Second)))
			if !sleepUntil(ctx, next) {
				break
			}
		}
		if cfg.rate == 0 && i < cfg.concurrency && cfg.ramp > 0 {
			// Client i joins at i/concurrency of the ramp, as users
			// arrive at a service; all at once, the first prompts queue
			// behind each other and their TTFT says so.
			if !sleepUntil(ctx, start.Add(cfg.ramp*time.Duration(i)/time.Duration(cfg.concurrency))) {
				break
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		body := requestBody(cfg, i)
		sending = time.Since(start)
		wg.Go(func() {
			defer func() { <-slots }()
			r := send(ctx, client, cfg, body)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	return results, time.Since(start), sending
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// requestBody builds request i: a prompt of cfg.inputWords words drawn
// at random (seeded by cfg.seed and i), so no two requests share more
// than the chat template's start — a server's prefix cache gets no help a
// real workload would not give it; with cfg.prompts > 0 request i repeats
// prompt i mod cfg.prompts, to measure prefix caching. It asks for
// exactly cfg.maxTokens tokens. With cfg.rangeRatio r its prompt's words
// and its tokens are drawn, each uniformly, from ±r of those (at least
// 1), by its own seed: a given request is the same in every run.
func requestBody(cfg config, i int) []byte {
	model := cfg.model
	if ms := strings.Split(cfg.model, ","); len(ms) > 1 { // requests take the models in turn
		model = ms[i%len(ms)]
	}
	if cfg.prompts > 0 {
		i %= cfg.prompts
	}
	rng := rand.New(rand.NewPCG(cfg.seed, uint64(i)))
	inputWords, maxTokens := spread(rng, cfg.inputWords, cfg.rangeRatio), spread(rng, cfg.maxTokens, cfg.rangeRatio)
	text := func() string {
		words := make([]string, inputWords)
		for w := range words {
			words[w] = vocabulary[rng.IntN(len(vocabulary))]
		}
		return strings.Join(words, " ")
	}
	if cfg.endpoint == "embeddings" {
		texts := make([]string, cfg.inputs)
		for j := range texts {
			texts[j] = text()
		}
		req := map[string]any{"model": model, "input": texts}
		if cfg.priority != "" {
			req["priority"] = cfg.priority
		}
		b, _ := json.Marshal(req)
		return b
	}
	prompt := text()
	req := map[string]any{
		"model": model, "max_tokens": maxTokens, "ignore_eos": true,
		"temperature": cfg.temperature, "stream": cfg.stream,
	}
	if cfg.stream {
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	if cfg.priority != "" {
		req["priority"] = cfg.priority
	}
	if cfg.endpoint == "chat" {
		req["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		req["prompt"] = prompt
	}
	b, _ := json.Marshal(req)
	return b
}

// spread is n, or with ratio r > 0 an integer drawn uniformly from
// [n(1-r), n(1+r)], at least 1 (vLLM's benchmark_serving
// --random-range-ratio).
func spread(rng *rand.Rand, n int, r float64) int {
	if r <= 0 {
		return n
	}
	lo, hi := max(1, int(math.Round(float64(n)*(1-r)))), int(math.Round(float64(n)*(1+r)))
	return lo + rng.IntN(max(1, hi-lo+1))
}

var vocabulary = strings.Fields("the quick brown fox jumps over a lazy dog while seven bright stars watch " +
	"quiet rivers carry old stories toward distant hills where patient farmers plant golden wheat")

func (c config) path() string {
	switch c.endpoint {
	case "chat":
		return "/v1/chat/completions"
	case "embeddings":
		return "/v1/embeddings"
	}
	return "/v1/completions"
}

// send runs one request and measures it.
func send(ctx context.Context, client *http.Client, cfg config, body []byte) *result {
	r := &result{start: time.Now()}
	defer func() { r.cut = errors.Is(r.err, context.DeadlineExceeded) && ctx.Err() != nil }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.target.JoinPath(cfg.path()).String(), bytes.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		r.err = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return r
	}
	if cfg.stream && cfg.endpoint != "embeddings" {
		r.err = readStream(resp.Body, r)
	} else {
		r.err = readWhole(resp.Body, r)
	}
	r.e2e = time.Since(r.start)
	return r
}

// chunk is the part of a response (or stream chunk) the generator reads.
type chunk struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Delta        struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func readWhole(body io.Reader, r *result) error {
	var c chunk
	if err := json.NewDecoder(body).Decode(&c); err != nil {
		return err
	}
	r.ttft = time.Since(r.start)
	if c.Usage == nil {
		return errors.New("response has no usage")
	}
	r.promptTokens, r.outputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	return nil
}

// readStream reads SSE chunks: every chunk with text is a token arrival.
func readStream(body io.Reader, r *result) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last time.Time
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			if r.outputTokens == 0 {
				return errors.New("stream ended without usage")
			}
			return nil
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return fmt.Errorf("bad chunk %q: %w", data, err)
		}
		if c.Error != nil {
			return fmt.Errorf("stream error: %s", c.Error.Message)
		}
		if c.Usage != nil {
			r.promptTokens, r.outputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		if len(c.Choices) == 0 || c.Choices[0].Text+c.Choices[0].Delta.Content == "" {
			if last.IsZero() && len(c.Choices) > 0 && c.Choices[0].FinishReason != "" {
				// A stream whose tokens all decoded to nothing (random
				// weights, special tokens): its first output is its end,
				// an upper bound of TTFT rather than a zero.
				r.ttft, r.textless = time.Since(r.start), true
			}
			continue
		}
		now := time.Now()
		if last.IsZero() {
			r.ttft = now.Sub(r.start)
		} else {
			r.itl = append(r.itl, now.Sub(last))
		}
		last = now
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("stream ended without [DONE]")
}
