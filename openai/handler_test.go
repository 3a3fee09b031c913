package openai_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mlxserving/mlxserving/openai"
)

func chatBody(extra map[string]any) map[string]any {
	b := map[string]any{
		"model":       "tiny",
		"messages":    []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}},
		"max_tokens":  8,
		"temperature": 0,
		"ignore_eos":  true,
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

type chatCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		FinishReason *string `json:"finish_reason"`
		Message      struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text     string          `json:"text"`
		Logprobs json.RawMessage `json:"logprobs"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decodeCompletion(t *testing.T, b []byte) chatCompletion {
	t.Helper()
	var c chatCompletion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return c
}

func TestChatNonStreaming(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	status, hdr, body := f.post(t, "/v1/chat/completions", chatBody(nil))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	c := decodeCompletion(t, body)
	if c.Object != "chat.completion" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Model != "tiny" || c.Created == 0 {
		t.Errorf("envelope: %s", body)
	}
	if len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("choices: %s", body)
	}
	u := c.Usage
	if u == nil || u.CompletionTokens != 8 || u.PromptTokens < 5 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage: %s", body)
	}
	if !strings.Contains(string(body), `"prompt_tokens_details":{"cached_tokens":0}`) {
		t.Errorf("usage lacks prompt_tokens_details.cached_tokens: %s", body)
	}
	_, _, body = f.post(t, "/v1/chat/completions", chatBody(map[string]any{"logprobs": true, "top_logprobs": 0}))
	var lp struct {
		Content []struct {
			Token       string  `json:"token"`
			Logprob     float64 `json:"logprob"`
			Bytes       []int   `json:"bytes"`
			TopLogprobs []any   `json:"top_logprobs"`
		} `json:"content"`
	}
	if err := json.Unmarshal(decodeCompletion(t, body).Choices[0].Logprobs, &lp); err != nil || len(lp.Content) != 8 {
		t.Fatalf("logprobs: %s (%v)", body, err)
	}
	for _, c := range lp.Content {
		if c.Logprob > 0 || c.TopLogprobs == nil || len(c.Bytes) != len(c.Token) {
			t.Fatalf("logprob entry %+v", c)
		}
	}
}

// TestChatStreaming checks the chunk sequence: role first, content, the
// finish reason, the usage chunk with empty choices, then [DONE]; and that
// the streamed text equals the non-streamed text of the same greedy request.
func TestChatStreaming(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	_, _, whole := f.post(t, "/v1/chat/completions", chatBody(nil))
	want := decodeCompletion(t, whole).Choices[0].Message.Content

	status, hdr, body := f.post(t, "/v1/chat/completions", chatBody(map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}))
	if status != http.StatusOK || hdr.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, Content-Type %q: %s", status, hdr.Get("Content-Type"), body)
	}
	events := sseEvents(t, body)
	if len(events) < 4 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events: %q", events)
	}
	var text strings.Builder
	var finish string
	for i, ev := range events[:len(events)-1] {
		c := decodeCompletion(t, []byte(ev))
		if c.Object != "chat.completion.chunk" || c.Model != "tiny" {
			t.Fatalf("chunk %d envelope: %s", i, ev)
		}
		switch {
		case i == 0:
			if len(c.Choices) != 1 || c.Choices[0].Delta.Role != "assistant" {
				t.Fatalf("first chunk carries no role: %s", ev)
			}
		case i == len(events)-2:
			if len(c.Choices) != 0 || c.Usage == nil || c.Usage.CompletionTokens != 8 {
				t.Fatalf("last chunk is not the usage chunk: %s", ev)
			}
		default:
			if c.Usage != nil {
				t.Errorf("chunk %d has usage: %s", i, ev)
			}
			if !strings.Contains(ev, `"usage":null`) {
				t.Errorf("chunk %d lacks usage:null with include_usage: %s", i, ev)
			}
			ch := c.Choices[0]
			if ch.Delta.Content != nil {
				text.WriteString(*ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if finish != "length" {
		t.Errorf("finish_reason %q, want length", finish)
	}
	if text.String() != want {
		t.Errorf("streamed text %q != non-streamed %q", text.String(), want)
	}
}

func TestCompletions(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, prompt := range []any{"Once upon a time", []int{1, 2, 3, 4}, []any{"Once upon a time"}, []any{[]int{5, 6, 7}}} {
		status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 5, "ignore_eos": true, "logprobs": 0})
		if status != http.StatusOK {
			t.Fatalf("prompt %v: status %d: %s", prompt, status, body)
		}
		c := decodeCompletion(t, body)
		if c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || c.Usage.CompletionTokens != 5 {
			t.Fatalf("prompt %v: %s", prompt, body)
		}
		var lp struct {
			Tokens        []string  `json:"tokens"`
			TokenLogprobs []float64 `json:"token_logprobs"`
		}
		if err := json.Unmarshal(c.Choices[0].Logprobs, &lp); err != nil || len(lp.TokenLogprobs) != 5 || len(lp.Tokens) != 5 {
			t.Fatalf("logprobs: %s (%v)", c.Choices[0].Logprobs, err)
		}
	}
	status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": "abc", "max_tokens": 3, "ignore_eos": true, "stream": true})
	events := sseEvents(t, body)
	if status != http.StatusOK || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream: %d %q", status, events)
	}
	last := decodeCompletion(t, []byte(events[len(events)-2]))
	if last.Object != "text_completion" || *last.Choices[0].FinishReason != "length" {
		t.Fatalf("last chunk %s", events[len(events)-2])
	}
}

// TestDefaultMaxTokens: without max_tokens a request generates up to what
// is left of the context when the default does not fit.
func TestDefaultMaxTokens(t *testing.T) {
	f := newFixture(t, fixtureOpts{handler: []openai.Option{openai.WithDefaultMaxTokens(100000)}})
	status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": []int{1, 2, 3, 4}, "ignore_eos": true})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	c := decodeCompletion(t, body)
	if got, want := c.Usage.CompletionTokens, 512-4; got != want || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("completion tokens %d, want %d (the rest of the 512-token context)", got, want)
	}
}

// TestSessionReusesPrefix: the second request of a session reuses the KV
// of the first (its prompt; the one token it generated was never fed).
func TestSessionReusesPrefix(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	first := []int{5, 6, 7, 8, 9, 10, 11, 12}
	status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": first, "max_tokens": 1, "session_id": "s1"})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	second := append(first, 20, 21, 22)
	status, _, body = f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": second, "max_tokens": 2}, "X-Session-ID", "s1")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if got := decodeCompletion(t, body).Usage.PromptTokensDetails.CachedTokens; got != len(first) {
		t.Fatalf("second request of the session reused %d tokens, want %d: %s", got, len(first), body)
	}
}

func TestEndpoints(t *testing.T) {
	reader := metric.NewManualReader()
	mp := metric.NewMeterProvider(metric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	metricsHit := false
	f := newFixture(t, fixtureOpts{handler: []openai.Option{
		openai.WithMeterProvider(mp),
		openai.WithMetricsHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			metricsHit = true
			_, _ = w.Write([]byte("# metrics\n"))
		})),
		openai.WithTraceHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"steps":"` + r.URL.Query().Get("steps") + `"}`))
		})),
	}})
	cases := []struct {
		path   string
		status int
		want   string
	}{
		{"/v1/models", 200, `"id":"tiny","object":"model"`},
		{"/v1/models/tiny", 200, `"owned_by":"mlxserving"`},
		{"/v1/models/nope", 404, `"code":"model_not_found"`},
		{"/health", 200, `"status":"ok"`},
		{"/ready", 200, `"status":"ready"`},
		{"/metrics", 200, "# metrics"},
		{"/v1/nothing", 404, `"code":"unknown_url"`},
		{"/v1/chat/completions", 405, `"code":"method_not_allowed"`},
	}
	for _, c := range cases {
		status, body := f.get(t, c.path)
		if status != c.status || !strings.Contains(string(body), c.want) {
			t.Errorf("GET %s: %d %s; want %d with %s", c.path, status, body, c.status, c.want)
		}
	}
	if !metricsHit {
		t.Error("/metrics did not reach the metrics handler")
	}
	if status, body := f.get(t, "/debug/trace"); status != 405 {
		t.Errorf("GET /debug/trace: %d %s, want 405", status, body)
	}
	if status, _, body := f.post(t, "/debug/trace?steps=7", ""); status != 200 || string(body) != `{"steps":"7"}` {
		t.Errorf("POST /debug/trace: %d %s, want the trace handler's answer", status, body)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if n := countRequests(rm, "models", "200"); n != 1 {
		t.Errorf("mlxserving.http.requests{route=models,status=200} = %d, want 1", n)
	}
	if n := countRequests(rm, "unknown", "404"); n != 1 {
		t.Errorf("mlxserving.http.requests{route=unknown,status=404} = %d, want 1", n)
	}
}

func countRequests(rm metricdata.ResourceMetrics, route, status string) int64 {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "mlxserving.http.requests" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				r, _ := dp.Attributes.Value("http.route")
				s, _ := dp.Attributes.Value("http.response.status_code")
				if r.AsString() == route && s.AsString() == status {
					return dp.Value
				}
			}
		}
	}
	return 0
}

func TestNotReadyWithoutModels(t *testing.T) {
	f := newFixture(t, fixtureOpts{noModel: true})
	if status, body := f.get(t, "/ready"); status != 503 || !strings.Contains(string(body), "no model loaded") {
		t.Fatalf("/ready: %d %s", status, body)
	}
	if status, _ := f.get(t, "/metrics"); status != 404 {
		t.Fatalf("/metrics without a handler: %d", status)
	}
	if status, _, body := f.post(t, "/debug/trace", ""); status != 404 || errCode(t, body) != "unknown_url" {
		t.Fatalf("/debug/trace without a handler: %d %s", status, body)
	}
	f2 := newFixture(t, fixtureOpts{handler: []openai.Option{openai.WithReadyCheck(func(context.Context) error { return errors.New("warming up") })}})
	if status, body := f2.get(t, "/ready"); status != 503 || !strings.Contains(string(body), "warming up") {
		t.Fatalf("/ready with a failing check: %d %s", status, body)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	f := newFixture(t, fixtureOpts{noModel: true})
	for _, o := range []openai.Option{openai.WithMaxBodyBytes(0), openai.WithDefaultMaxTokens(-1), openai.WithLogger(nil),
		openai.WithMeterProvider(nil), openai.WithMetricsHandler(nil), openai.WithReadyCheck(nil)} {
		if _, err := openai.New(f.srv, o); err == nil {
			t.Error("a bad option was accepted")
		}
	}
	if _, err := openai.New(nil); err == nil {
		t.Error("nil server accepted")
	}
}
