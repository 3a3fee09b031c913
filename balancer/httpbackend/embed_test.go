package httpbackend_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/testmodel"
)

func texts(n int) []api.EmbedInput {
	in := make([]api.EmbedInput, n)
	for i := range in {
		in[i].Text = fmt.Sprintf("document %d about %s", i, strings.Repeat("things ", i%5+1))
	}
	return in
}

// sameEmbeddings fails the test unless got is want: the model, the token
// count and every vector bit for bit.
func sameEmbeddings(t *testing.T, what string, got, want *api.Embeddings) {
	t.Helper()
	if got.Model != want.Model || got.PromptTokens != want.PromptTokens || len(got.Vectors) != len(want.Vectors) {
		t.Fatalf("%s: model %q, %d tokens, %d vectors; want %q, %d, %d", what, got.Model, got.PromptTokens, len(got.Vectors),
			want.Model, want.PromptTokens, len(want.Vectors))
	}
	for i, w := range want.Vectors {
		g := got.Vectors[i]
		if len(g) != len(w) {
			t.Fatalf("%s: vector %d has %d values, want %d", what, i, len(g), len(w))
		}
		for j := range w {
			if math.Float32bits(g[j]) != math.Float32bits(w[j]) {
				t.Fatalf("%s: vector %d value %d is %v, want %v", what, i, j, g[j], w[j])
			}
		}
	}
}

// TestEmbed: texts, token ids and both mixed in one request, posted to an
// mlxserving upstream's /v1/embeddings, come back as the Server's vectors
// bit for bit, with Matryoshka dimensions; the priority travels in
// X-Priority.
func TestEmbed(t *testing.T) {
	u := newUpstream(t, []enginetest.SimOption{enginetest.WithEmbedding(64, engine.PoolMean, true, true)})
	b := newBackend(t, u.ts.URL)
	tokens := []api.EmbedInput{{Tokens: []int32{5, 9, 12}}, {Tokens: []int32{7}}}
	mixed := []api.EmbedInput{texts(3)[0], tokens[0], texts(3)[1], tokens[1], texts(3)[2]}
	for _, tc := range []struct {
		name     string
		inputs   []api.EmbedInput
		dims     int
		requests int
	}{{"texts", texts(9), 0, 1}, {"tokens", tokens, 0, 1}, {"mixed", mixed, 0, 2}, {"dimensions", texts(4), 16, 1}} {
		req := api.EmbedRequest{Model: "tiny", Inputs: tc.inputs, Dimensions: tc.dims, Priority: api.High}
		want, err := u.srv.Embed(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		u.mu.Lock()
		before := len(u.headers)
		u.mu.Unlock()
		got, err := b.Embed(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		sameEmbeddings(t, tc.name, got, want)
		var sent []http.Header // the requests, not the poller's reads
		u.mu.Lock()
		for _, h := range u.headers[before:] {
			if h.Get("Content-Type") == "application/json" {
				sent = append(sent, h)
			}
		}
		u.mu.Unlock()
		if len(sent) != tc.requests {
			t.Errorf("%s: %d requests, want %d", tc.name, len(sent), tc.requests)
		}
		for _, h := range sent {
			if h.Get("X-Priority") != "high" {
				t.Errorf("%s: X-Priority %q", tc.name, h.Get("X-Priority"))
			}
		}
	}
}

// TestEmbedTypedErrors: an mlxserving upstream's refusals arrive as the
// same typed errors, not retryable; an input of a mixed request is named
// as the caller counts them.
func TestEmbedTypedErrors(t *testing.T) {
	u := newUpstream(t, []enginetest.SimOption{enginetest.WithEmbedding(32, engine.PoolLast, true, false)})
	b := newBackend(t, u.ts.URL)
	ctx := context.Background()
	invalid := func(what string, req api.EmbedRequest, param string) {
		t.Helper()
		_, err := b.Embed(ctx, req)
		var ip *api.InvalidParamError
		var he *httpbackend.Error
		if !errors.As(err, &ip) || ip.Param != param || !errors.As(err, &he) || he.Status != http.StatusBadRequest || retry.Classify(err).Retryable() {
			t.Errorf("%s: %v, want a not retryable 400 and an *api.InvalidParamError for %s", what, err, param)
		}
	}
	invalid("no inputs", api.EmbedRequest{Model: "tiny"}, "input")
	invalid("an empty input", api.EmbedRequest{Model: "tiny", Inputs: []api.EmbedInput{{Text: "a"}, {}}}, "input")
	invalid("dimensions of a model that is not Matryoshka", api.EmbedRequest{Model: "tiny", Inputs: texts(1), Dimensions: 8}, "dimensions")
	bad := []api.EmbedInput{{Text: "a"}, {Tokens: []int32{3}}, {Text: "b"}, {Tokens: []int32{1 << 30}}}
	invalid("a token id outside the vocabulary, in a mixed request", api.EmbedRequest{Model: "tiny", Inputs: bad}, "input[3]")

	long := make([]int32, testmodel.Tiny().ContextLength+5)
	for i := range long {
		long[i] = 3
	}
	_, err := b.Embed(ctx, api.EmbedRequest{Model: "tiny", Inputs: []api.EmbedInput{{Tokens: long}}})
	var cl *engine.ContextLengthError
	if !errors.As(err, &cl) || cl.Prompt != len(long) || cl.Limit != testmodel.Tiny().ContextLength || retry.Classify(err).Retryable() {
		t.Errorf("an input over the context: %v, want a *engine.ContextLengthError with its numbers", err)
	}
	if _, err := b.Embed(ctx, api.EmbedRequest{Model: "nope", Inputs: texts(1)}); !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("an unknown model: %v", err)
	}
	if _, err := b.Embed(ctx, api.EmbedRequest{Model: "tiny", Inputs: append(texts(api.MaxEmbedInputs), bad[1])}); err == nil {
		t.Error("a mixed request of more than MaxEmbedInputs inputs was sent")
	}
}

// TestEmbedFailsOver: a balancer sends an embedding request that an
// upstream could not take (down) to another.
func TestEmbedFailsOver(t *testing.T) {
	u := newUpstream(t, nil)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	lb, err := balancer.New(balancer.WithStrategy(balancer.RoundRobin()))
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	for name, url := range map[string]string{"down": down.URL, "up": u.ts.URL} {
		if err := lb.Add(name, newBackend(t, url, httpbackend.WithModels("tiny"))); err != nil {
			t.Fatal(err)
		}
	}
	want, err := u.srv.Embed(context.Background(), api.EmbedRequest{Model: "tiny", Inputs: texts(3)})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		got, err := lb.Embed(context.Background(), api.EmbedRequest{Model: "tiny", Inputs: texts(3)})
		if err != nil {
			t.Fatal(err)
		}
		sameEmbeddings(t, "through the balancer", got, want)
	}
	if s := lb.Stats(); s.Failovers == 0 {
		t.Errorf("no request failed over from the upstream that is down: %+v", s)
	}
}

// openAIEmbeddings mimics OpenAI's /v1/embeddings as documented: it
// checks the request and answers vector i as i+1, i+2, ... (dims values),
// in the encoding asked for unless floats is set (an upstream that
// ignores encoding_format), items in reverse order (they carry their
// index).
type openAIEmbeddings struct {
	t      *testing.T
	dims   int
	floats bool

	mu     sync.Mutex
	bodies []map[string]any
}

func (o *openAIEmbeddings) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/embeddings" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	o.bodies = append(o.bodies, body)
	o.mu.Unlock()
	inputs, _ := body["input"].([]any)
	type item struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}
	var data []item
	for i := len(inputs) - 1; i >= 0; i-- {
		v := make([]float32, o.dims)
		b := make([]byte, 4*o.dims)
		for j := range v {
			v[j] = float32(i + j + 1)
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v[j]))
		}
		it := item{Object: "embedding", Index: i, Embedding: v}
		if body["encoding_format"] == "base64" && !o.floats {
			it.Embedding = base64.StdEncoding.EncodeToString(b)
		}
		data = append(data, it)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data, "model": body["model"],
		"usage": map[string]int{"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}})
}

// TestEmbedOpenAIUpstream: against an upstream answering as OpenAI
// documents, the request is OpenAI's (no extension fields unless set) and
// the answer is read in either encoding, items in any order.
func TestEmbedOpenAIUpstream(t *testing.T) {
	for _, floats := range []bool{false, true} {
		o := &openAIEmbeddings{t: t, dims: 5, floats: floats}
		ts := httptest.NewServer(o)
		defer ts.Close()
		b := newBackend(t, ts.URL)
		got, err := b.Embed(context.Background(), api.EmbedRequest{Model: "text-embedding-3-small", Inputs: texts(3)})
		if err != nil {
			t.Fatal(err)
		}
		if got.Model != "text-embedding-3-small" || got.PromptTokens != 9 || len(got.Vectors) != 3 {
			t.Fatalf("floats %v: %+v", floats, got)
		}
		for i, v := range got.Vectors {
			for j, x := range v {
				if x != float32(i+j+1) {
					t.Fatalf("floats %v: vector %d is %v", floats, i, v)
				}
			}
		}
		_, err = b.Embed(context.Background(), api.EmbedRequest{Model: "m", Inputs: []api.EmbedInput{{Tokens: []int32{1, 2}}},
			Dimensions: 4, Truncate: true, Cache: true, Client: "u1"})
		if err != nil {
			t.Fatal(err)
		}
		o.mu.Lock()
		plain, ext := o.bodies[0], o.bodies[1]
		o.mu.Unlock()
		if plain["encoding_format"] != "base64" || len(plain) != 3 { // model, input, encoding_format
			t.Errorf("a plain request's body: %v", plain)
		}
		ids, _ := ext["input"].([]any)
		if len(ids) != 1 || fmt.Sprint(ids[0]) != "[1 2]" || ext["dimensions"] != 4.0 || ext["truncate"] != true || ext["cache"] != true || ext["user"] != "u1" {
			t.Errorf("a request with extensions: %v", ext)
		}
	}
}

// TestEmbedBadUpstream: an answer that is not an embeddings list, or
// does not hold one vector per input, is a *ProtocolError; a 429 with
// Retry-After is a retryable *scheduler.RateLimitError.
func TestEmbedBadUpstream(t *testing.T) {
	answers := map[string]func(w http.ResponseWriter){
		"html": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html>")
		},
		"short": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1,2]}],"model":"m"}`)
		},
		"index": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}],"model":"m"}`)
		},
		"base64": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"index":0,"embedding":"AAA="},{"index":1,"embedding":"AACAPw=="}],"model":"m"}`)
		},
	}
	for name, answer := range answers {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { answer(w) }))
		_, err := newBackend(t, ts.URL).Embed(context.Background(), api.EmbedRequest{Model: "m", Inputs: texts(2)})
		ts.Close()
		var pe *httpbackend.ProtocolError
		if !errors.As(err, &pe) {
			t.Errorf("%s: %v, want a *httpbackend.ProtocolError", name, err)
		}
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "3")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`)
	}))
	defer ts.Close()
	_, err := newBackend(t, ts.URL).Embed(context.Background(), api.EmbedRequest{Model: "m", Inputs: texts(2)})
	var rl *scheduler.RateLimitError
	if d, ok := retry.RetryAfter(err); !errors.As(err, &rl) || !ok || d != 3*time.Second || !retry.Classify(err).Retryable() {
		t.Errorf("a 429: %v, want a retryable *scheduler.RateLimitError after 3s", err)
	}
}

// TestEmbedEscapedBase64: a base64 vector with its slashes escaped ("\/",
// as some JSON encoders write them) reads as the same vector.
func TestEmbedEscapedBase64(t *testing.T) {
	v := []float32{-1.5e-7, 3.25, float32(math.Inf(1)), 0.1}
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	enc := base64.StdEncoding.EncodeToString(b)
	if !strings.Contains(enc, "/") {
		t.Fatalf("%q has no slash to escape: pick other values", enc)
	}
	for _, s := range []string{enc, strings.ReplaceAll(enc, "/", `\/`)} {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":"%s"}],"model":"m"}`, s)
		}))
		res, err := newBackend(t, ts.URL).Embed(context.Background(), api.EmbedRequest{Model: "m", Inputs: texts(1)})
		ts.Close()
		if err != nil {
			t.Fatal(err)
		}
		for i, x := range v {
			if math.Float32bits(res.Vectors[0][i]) != math.Float32bits(x) {
				t.Fatalf("%s: %v, want %v", s, res.Vectors[0], v)
			}
		}
	}
}

// TestEmbedCancel: a caller's deadline ends the request on the upstream
// too (its sequences are cancelled); an upstream that answers nothing
// within the header timeout fails with a retryable ErrHeaderTimeout.
func TestEmbedCancel(t *testing.T) {
	u := newUpstream(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(1)})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := newBackend(t, u.ts.URL).Embed(ctx, api.EmbedRequest{Model: "tiny", Inputs: texts(400)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("past the deadline: %v", err)
	}
	waitFor(t, "the sequences cancelled", func() bool { return u.sim.Stats().OpenSequences == 0 && u.srv.Load().Waiting == 0 })

	_, err = newBackend(t, u.ts.URL, httpbackend.WithHeaderTimeout(50*time.Millisecond)).Embed(context.Background(),
		api.EmbedRequest{Model: "tiny", Inputs: texts(400)})
	if !errors.Is(err, httpbackend.ErrHeaderTimeout) || !retry.Classify(err).Retryable() {
		t.Fatalf("an upstream slower than the header timeout: %v", err)
	}
	waitFor(t, "the sequences cancelled", func() bool { return u.sim.Stats().OpenSequences == 0 && u.srv.Load().Waiting == 0 })
}
