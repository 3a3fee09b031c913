package openai_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/natstest"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

// transport is one way to reach the same Server: the handler over the
// Server itself, or over a load balancer whose only backend reaches it by
// HTTP (httpbackend) or by NATS (natsbackend).
type transport struct {
	name string
	ts   *httptest.Server
}

// transports puts the fixture's Server behind each transport.
func transports(t *testing.T, f *fixture) []transport {
	t.Helper()
	out := []transport{{"direct", f.ts}}
	gateway := func(name string, add func(lb *balancer.LoadBalancer)) {
		lb, err := balancer.New()
		if err != nil {
			t.Fatal(err)
		}
		add(lb)
		h, err := openai.New(lb)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(h)
		t.Cleanup(func() {
			ts.Close()
			_ = lb.Close()
		})
		out = append(out, transport{name, ts})
	}
	gateway("http", func(lb *balancer.LoadBalancer) {
		hb, err := httpbackend.New(f.ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hb.Close() })
		if err := lb.Add("instance", hb); err != nil {
			t.Fatal(err)
		}
	})
	url := natstest.Start(t, "")
	conn := func() *nats.Conn {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	svc, err := natsbackend.Serve(conn(), "instance", f.srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	gateway("nats", func(lb *balancer.LoadBalancer) {
		d, err := natsbackend.Discover(context.Background(), conn(), lb, natsbackend.WithInterval(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		waitFor(t, "the instance over NATS", func() bool {
			st := lb.Stats().Backends
			return len(st) == 1 && st[0].Load.Serves("tiny")
		})
	})
	return out
}

// answer is what a client sees of a refused request.
type answer struct {
	Status     int
	Type       string
	Code       string
	Param      string
	RetryAfter bool
}

func ask(t *testing.T, ts *httptest.Server, path, body string, header ...string) answer {
	t.Helper()
	f := &fixture{ts: ts}
	status, hdr, b := f.post(t, path, body, header...)
	a := answer{Status: status, RetryAfter: hdr.Get("Retry-After") != ""}
	if status == http.StatusOK {
		return a
	}
	var e struct {
		Error struct {
			Type  string `json:"type"`
			Code  any    `json:"code"`
			Param any    `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%s: %d with a body that is no OpenAI error: %s", ts.URL, status, b)
	}
	a.Type = e.Error.Type
	if s, ok := e.Error.Code.(string); ok {
		a.Code = s
	}
	if s, ok := e.Error.Param.(string); ok {
		a.Param = s
	}
	return a
}

// TestErrorsAcrossTransports: every refusal of the Server reaches an
// OpenAI client as the same status, error type, code, param and
// Retry-After whether the handler serves the Server itself or a balancer
// that reaches it over HTTP or NATS; and a request the Server fits (no
// max_tokens) is fitted the same way through either.
func TestErrorsAcrossTransports(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ts := transports(t, f)
	long := strings.Repeat("word ", 3000)
	cases := []struct {
		name, path, body string
		header           []string
		want             answer
	}{
		{"bad temperature", "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":4,"temperature":5}`, nil,
			answer{Status: 400, Type: "invalid_request_error", Code: "invalid_value", Param: "temperature"}},
		{"bad top_p", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"top_p":3}`, nil,
			answer{Status: 400, Type: "invalid_request_error", Code: "invalid_value", Param: "top_p"}},
		{"max_tokens past the context", "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":1000000}`, nil,
			answer{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded"}},
		{"prompt past the context", "/v1/completions", `{"model":"tiny","prompt":"` + long + `","max_tokens":4}`, nil,
			answer{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded"}},
		{"unknown model", "/v1/completions", `{"model":"nope","prompt":"hi","max_tokens":4}`, nil,
			answer{Status: 404, Type: "not_found_error", Code: "model_not_found", Param: "model"}},
		{"unknown tier", "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":4}`, []string{"X-Priority", "bogus"},
			answer{Status: 400, Type: "invalid_request_error", Code: "invalid_value"}},
		{"bad schema", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,
			"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"frobnicate"}}}}`, nil,
			answer{Status: 400, Type: "invalid_request_error", Code: "invalid_value"}},
		{"no max_tokens: fitted", "/v1/completions", `{"model":"tiny","prompt":"hi"}`, nil,
			answer{Status: 200}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, tr := range ts {
				got := ask(t, tr.ts, c.path, c.body, c.header...)
				want := c.want
				if want.Param == "" {
					got.Param = "" // not asserted for this case
				}
				if got != want {
					t.Errorf("%s: %+v, want %+v", tr.name, got, want)
				}
			}
		})
	}
	// Last, a closed Server: 503 with Retry-After through every transport.
	_ = f.srv.Close()
	for _, tr := range ts {
		got := ask(t, tr.ts, "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":4}`)
		if got.Status != http.StatusServiceUnavailable || !got.RetryAfter {
			t.Errorf("closed Server, %s: %+v, want 503 with Retry-After", tr.name, got)
		}
	}
}

// TestLimitsAcrossTransports: a rate-limited client gets 429 with
// Retry-After, and a missed deadline 504 with its code, through every
// transport as from the Server itself.
func TestLimitsAcrossTransports(t *testing.T) {
	t.Run("rate limit", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{server: []mlxserving.Option{
			mlxserving.WithSchedulerOptions(scheduler.WithRateLimit(0.01, 1))}})
		for _, tr := range transports(t, f) {
			body := `{"model":"tiny","prompt":"hi","max_tokens":2,"user":"` + tr.name + `"}`
			if got := ask(t, tr.ts, "/v1/completions", body); got.Status != http.StatusOK {
				t.Fatalf("%s: first request %+v", tr.name, got)
			}
			got := ask(t, tr.ts, "/v1/completions", body)
			want := answer{Status: 429, Type: "rate_limit_error", Code: "rate_limit_exceeded", RetryAfter: true}
			if got != want {
				t.Errorf("%s: %+v, want %+v", tr.name, got, want)
			}
		}
	})
	t.Run("deadline", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{
			sim:    []enginetest.SimOption{enginetest.WithStepTime(50*time.Millisecond, 0)},
			server: []mlxserving.Option{mlxserving.WithDeadlines(retry.Deadlines{FirstToken: 10 * time.Millisecond})}})
		for _, tr := range transports(t, f) {
			got := ask(t, tr.ts, "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":2}`)
			want := answer{Status: 504, Type: "server_error", Code: "time_to_first_token_exceeded"}
			if got != want {
				t.Errorf("%s: %+v, want %+v", tr.name, got, want)
			}
		}
	})
}

// TestQueueFullAcrossTransports: a Server whose queue is full answers 429
// queue_full with Retry-After through every transport; a balancer whose
// only backend is full passes the refusal on rather than a 503.
func TestQueueFullAcrossTransports(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		sim:    []enginetest.SimOption{enginetest.WithStepTime(20*time.Millisecond, 0), enginetest.WithMaxBatch(1)},
		server: []mlxserving.Option{mlxserving.WithSchedulerOptions(scheduler.WithMaxQueued(1))}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := api.Request{Model: "tiny", Prompt: "hi", Params: api.Params{MaxTokens: 400, IgnoreEOS: true}}
	running, err := f.srv.Generate(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	if _, err := running.Recv(); err != nil { // it holds the batch's one slot
		t.Fatal(err)
	}
	queued, err := f.srv.Generate(ctx, long) // and this the queue's one place
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()
	for _, tr := range transports(t, f) {
		got := ask(t, tr.ts, "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":2}`)
		want := answer{Status: 429, Type: "rate_limit_error", Code: "queue_full", RetryAfter: true}
		if got != want {
			t.Errorf("%s: %+v, want %+v", tr.name, got, want)
		}
	}
}

// TestKVCapacityAcrossTransports: a request larger than the model's whole
// KV cache (though within its context) is refused as exceeds_kv_capacity
// naming max_tokens through every transport, as from the Server itself:
// a balancer tries its other backends and, with none that has the room,
// passes the last refusal on rather than a 503.
func TestKVCapacityAcrossTransports(t *testing.T) {
	f := newFixture(t, fixtureOpts{sim: []enginetest.SimOption{enginetest.WithKVCapacity(64)}})
	for _, tr := range transports(t, f) {
		got := ask(t, tr.ts, "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":100}`)
		want := answer{Status: 400, Type: "invalid_request_error", Code: "exceeds_kv_capacity", Param: "max_tokens"}
		if got != want {
			t.Errorf("%s: %+v, want %+v", tr.name, got, want)
		}
	}
}

// TestForcedTokensAcrossTransports: a structured-output request decoded
// with jump-forward reports its forced tokens in
// usage.completion_tokens_details, the same through every transport, and
// the document is the schema's.
func TestForcedTokensAcrossTransports(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	body := `{"model":"tiny","max_tokens":200,"seed":3,"messages":[{"role":"user","content":"hi"}],
		"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{
		"kind":{"const":"record"},"state":{"enum":["enabled","disabled"]}},"required":["kind","state"],"additionalProperties":false}}}}`
	var want string
	for _, tr := range transports(t, f) {
		status, _, b := (&fixture{ts: tr.ts}).post(t, "/v1/chat/completions", body)
		if status != http.StatusOK {
			t.Fatalf("%s: %d %s", tr.name, status, b)
		}
		var res struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
				Details          *struct {
					ForcedTokens int `json:"forced_tokens"`
				} `json:"completion_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &res); err != nil || len(res.Choices) != 1 {
			t.Fatalf("%s: %s: %v", tr.name, b, err)
		}
		var doc struct{ Kind, State string }
		if err := json.Unmarshal([]byte(res.Choices[0].Message.Content), &doc); err != nil || doc.Kind != "record" {
			t.Fatalf("%s: content %q: %v", tr.name, res.Choices[0].Message.Content, err)
		}
		u := res.Usage
		if u.Details == nil || u.Details.ForcedTokens == 0 || u.Details.ForcedTokens >= u.CompletionTokens {
			t.Fatalf("%s: usage %s: want some but not all completion tokens forced", tr.name, b)
		}
		got := fmt.Sprintf("%s %d/%d", res.Choices[0].Message.Content, u.Details.ForcedTokens, u.CompletionTokens)
		if want == "" {
			want = got
		} else if got != want {
			t.Errorf("%s: %s; direct gave %s", tr.name, got, want)
		}
	}
}
