package httpbackend_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

func generate(b *httpbackend.Backend, n int) (*api.Stream, error) {
	return b.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "hello", Params: greedy(n)})
}

// TestConnectionRefused: nobody listening is a retryable *Error wrapping
// ECONNREFUSED, returned before any stream.
func TestConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	b := newBackend(t, "http://"+addr)
	_, err = generate(b, 4)
	var he *httpbackend.Error
	if !errors.As(err, &he) || !he.Retryable() || he.Status != 0 {
		t.Fatalf("err %v, want a retryable *Error without status", err)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || !retry.Retryable(err) {
		t.Errorf("%v: want ECONNREFUSED, retryable by retry.Retryable", err)
	}
	if err := b.Refresh(context.Background()); err == nil || b.PollErr() == nil {
		t.Errorf("poll of a dead upstream: %v / %v", err, b.PollErr())
	}
}

// TestRateLimitedRetryAfter: the upstream's 429 with Retry-After (its
// per-client rate limit) is a retryable *Error carrying RetryAfter.
func TestRateLimitedRetryAfter(t *testing.T) {
	u := newUpstream(t, nil, mlxserving.WithSchedulerOptions(scheduler.WithRateLimit(0.5, 1)))
	b := newBackend(t, u.ts.URL)
	p := greedy(2)
	p.Client = "alice"
	req := api.Request{Model: "tiny", Prompt: "hi", Params: p}
	if _, err := mustStream(b.Generate(context.Background(), req)).Collect(); err != nil {
		t.Fatal(err)
	}
	_, err := b.Generate(context.Background(), req)
	var he *httpbackend.Error
	if !errors.As(err, &he) || he.Status != http.StatusTooManyRequests || he.RetryAfter < time.Second || !he.Retryable() {
		t.Fatalf("err %v, want a retryable 429 with Retry-After", err)
	}
	if d, ok := retry.RetryAfter(err); !ok || d != he.RetryAfter {
		t.Errorf("retry.RetryAfter %v %v", d, ok)
	}
}

// TestKilledMidStream: the upstream dying after tokens reached the caller
// ends the stream with a *retry.InterruptedError, not a short success.
func TestKilledMidStream(t *testing.T) {
	u := newUpstream(t, []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)})
	b := newBackend(t, u.ts.URL)
	st, err := generate(b, 400)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for range 3 {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	u.ts.CloseClientConnections()
	var err2 error
	for err2 == nil {
		_, err2 = st.Recv()
	}
	var ie *retry.InterruptedError
	if !errors.As(err2, &ie) || ie.Delivered < 3 {
		t.Fatalf("err %v, want an InterruptedError after at least 3 chunks", err2)
	}
	if retry.Retryable(err2) {
		t.Error("an interrupted stream must not be retryable")
	}
}

// garbage serves fixed responses: the upstreams that misbehave.
func garbage(t *testing.T, h http.HandlerFunc) string {
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	for _, e := range events {
		fmt.Fprintf(w, "%s\n\n", e)
		w.(http.Flusher).Flush()
	}
}

const tok = `data: {"choices":[{"index":0,"text":"hi","finish_reason":null}]}`

// TestGarbage: responses that are not an OpenAI event stream end with
// typed errors — retryable *Error before any text, InterruptedError after.
func TestGarbage(t *testing.T) {
	cases := []struct {
		name        string
		h           http.HandlerFunc
		text        string // delivered before the failure
		wantProto   bool
		wantTrunc   bool
		wantStream  bool
		interrupted bool
	}{
		{name: "html page", wantProto: true, h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html>proxy says hi</html>")
		}},
		{name: "not json", wantProto: true, h: func(w http.ResponseWriter, r *http.Request) { sse(w, "data: {oops") }},
		{name: "empty stream", wantTrunc: true, h: func(w http.ResponseWriter, r *http.Request) { sse(w) }},
		{name: "done without finish", wantTrunc: true, h: func(w http.ResponseWriter, r *http.Request) { sse(w, "data: [DONE]") }},
		{name: "cut after text", text: "hihi", wantTrunc: true, interrupted: true, h: func(w http.ResponseWriter, r *http.Request) { sse(w, tok, tok) }},
		{name: "garbage after text", text: "hi", wantProto: true, interrupted: true, h: func(w http.ResponseWriter, r *http.Request) { sse(w, tok, "data: <<<") }},
		{name: "line too long", wantProto: true, h: func(w http.ResponseWriter, r *http.Request) {
			sse(w, "data: "+strings.Repeat("x", 4096))
		}},
		{name: "error event", wantStream: true, h: func(w http.ResponseWriter, r *http.Request) {
			sse(w, `data: {"error":{"message":"worker died","type":"server_error","code":"engine_error"}}`)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, garbage(t, tc.h), httpbackend.WithMaxLineBytes(1024))
			var text strings.Builder
			st, err := generate(b, 8)
			if err == nil {
				for c, rerr := range st.Chunks() {
					if rerr != nil {
						err = rerr
						break
					}
					text.WriteString(c.Text)
				}
			}
			if err == nil {
				t.Fatal("no error")
			}
			var pe *httpbackend.ProtocolError
			var se *httpbackend.StreamError
			var he *httpbackend.Error
			var ie *retry.InterruptedError
			switch {
			case tc.wantProto && !errors.As(err, &pe), tc.wantTrunc && !errors.Is(err, httpbackend.ErrTruncated),
				tc.wantStream && !errors.As(err, &se):
				t.Fatalf("err %v: wrong kind", err)
			case tc.interrupted && !errors.As(err, &ie):
				t.Fatalf("err %v, want InterruptedError", err)
			case !tc.interrupted && (!errors.As(err, &he) || !he.Retryable()):
				t.Fatalf("err %v, want a retryable *Error", err)
			}
			if text.String() != tc.text {
				t.Errorf("delivered %q, want %q", text.String(), tc.text)
			}
		})
	}
}

// TestStreamErrorTyped: an error event after text unwraps, like an
// *Error, to the typed error its code stands for, so the failure inside
// the InterruptedError classifies as the upstream's (whether it counts
// against the backend's breaker, the code a gateway passes on).
func TestStreamErrorTyped(t *testing.T) {
	for _, tc := range []struct {
		event, code string
		typed       func(error) bool
	}{
		{`{"message":"no token for 2s","type":"server_error","code":"stall_timeout"}`, retry.CodeStallDeadline,
			func(err error) bool {
				var de *retry.DeadlineError
				return errors.As(err, &de) && de.Kind == retry.Stall
			}},
		{`{"message":"bad","type":"invalid_request_error","param":"top_p","code":"invalid_value"}`, retry.CodeInvalidValue,
			func(err error) bool {
				var ip *engine.InvalidParamError
				return errors.As(err, &ip) && ip.Param == "top_p"
			}},
		{`{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded","context":{"prompt_tokens":9,"max_tokens":4,"context_length":12}}`,
			retry.CodeContextLength,
			func(err error) bool {
				var cl *engine.ContextLengthError
				return errors.As(err, &cl) && cl.Limit == 12 && cl.Prompt == 9
			}},
		{`{"message":"worker died","type":"server_error","code":"` + retry.CodeWorkerLost + `"}`, retry.CodeWorkerLost,
			func(err error) bool { return errors.Is(err, engine.ErrWorkerLost) }},
		{`{"message":"odd","type":"server_error","code":"foreign_code"}`, retry.CodeInternal,
			func(err error) bool {
				var se *httpbackend.StreamError
				return errors.As(err, &se) && errors.Unwrap(se) == nil
			}},
	} {
		t.Run(tc.code, func(t *testing.T) {
			b := newBackend(t, garbage(t, func(w http.ResponseWriter, r *http.Request) { sse(w, tok, `data: {"error":`+tc.event+`}`) }))
			_, err := mustStream(generate(b, 8)).Collect()
			var ie *retry.InterruptedError
			if !errors.As(err, &ie) || !tc.typed(err) {
				t.Fatalf("err %v: want an InterruptedError over the typed error", err)
			}
			if got := retry.Classify(ie.Err).Code; got != tc.code {
				t.Errorf("class code %q, want %q", got, tc.code)
			}
		})
	}
}

// TestNonStreamingUpstream: an upstream that ignores stream:true and
// answers one JSON body is read as one chunk and the final chunk; a JSON
// body that is no completion is a retryable ProtocolError.
func TestNonStreamingUpstream(t *testing.T) {
	url := garbage(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/chat/completions" {
			fmt.Fprint(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi there"},"finish_reason":"stop"}],`+
				`"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":3}}}`)
			return
		}
		fmt.Fprint(w, `{"status":"ok"}`)
	})
	b := newBackend(t, url)
	st, err := b.Chat(context.Background(), api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "x"}}, Params: greedy(4)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil || res.Text != "Hi there" || res.Finish != api.FinishStop || res.Usage.PromptTokens != 7 || res.Usage.CachedTokens != 3 {
		t.Fatalf("%+v %v", res, err)
	}
	_, err = generate(b, 4)
	var pe *httpbackend.ProtocolError
	var he *httpbackend.Error
	if !errors.As(err, &pe) || !errors.As(err, &he) || !he.Retryable() {
		t.Fatalf("JSON that is no completion: %v", err)
	}
}

// TestHeaderTimeout: an upstream that hangs before its first byte fails
// the request with a retryable ErrHeaderTimeout.
func TestHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	url := garbage(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	b := newBackend(t, url, httpbackend.WithHeaderTimeout(50*time.Millisecond))
	start := time.Now()
	_, err := generate(b, 4)
	var he *httpbackend.Error
	if !errors.Is(err, httpbackend.ErrHeaderTimeout) || !errors.As(err, &he) || !he.Retryable() {
		t.Fatalf("err %v, want a retryable ErrHeaderTimeout", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
}

// TestBalancerFailsOver: behind a balancer.LoadBalancer, a refusing
// upstream is skipped and the request served by a live one.
func TestBalancerFailsOver(t *testing.T) {
	u := newUpstream(t, nil)
	dead := garbage(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"tiny","object":"model"}]}`)
			return
		}
		w.Header().Set("Retry-After", "3")
		http.Error(w, `{"error":{"message":"overloaded","type":"overloaded_error","code":"unavailable"}}`, http.StatusServiceUnavailable)
	})
	lb, err := balancer.New(balancer.WithStrategy(balancer.RoundRobin()))
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	for name, url := range map[string]string{"live": u.ts.URL, "dead": dead} {
		b := newBackend(t, url)
		if err := b.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := lb.Add(name, b); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		st, err := lb.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "hello", Params: greedy(4)})
		if err != nil {
			t.Fatal(err)
		}
		if st.Header().Backend != "live" {
			t.Errorf("served by %q", st.Header().Backend)
		}
		if res, err := st.Collect(); err != nil || res.Usage.CompletionTokens != 4 {
			t.Fatalf("%+v %v", res, err)
		}
	}
	if s := lb.Stats(); s.Failovers == 0 {
		t.Errorf("no failover counted: %+v", s)
	}
}
