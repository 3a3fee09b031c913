package natsbackend_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/testmodel"
)

// embedInputs is n distinct inputs, every third one token ids, the others
// texts of about chars characters.
func embedInputs(n, chars int) []api.EmbedInput {
	in := make([]api.EmbedInput, n)
	for i := range in {
		if i%3 == 2 {
			in[i].Tokens = []int32{int32(3 + i%50), int32(7 + i%13), int32(11 + i%7)}
			continue
		}
		text := fmt.Sprintf("document %d: ", i)
		for len(text) < chars {
			text += fmt.Sprintf("word%d ", (i*31+len(text))%97)
		}
		in[i].Text = text
	}
	return in
}

// slowMachine lets the tests that move megabytes of vectors stall for
// seconds before the instance counts as lost: under the race detector on
// a loaded 2-core machine, encoding and decoding them (and the collector
// behind them) can hold the instance's probe answers past the default
// 200 ms probe timeout and its stats past the tests' 500 ms timeout, as
// well as 20 of its heartbeats (100 ms). Lost instances are what
// TestEmbedFailsOver tests.
var slowMachine = []natsbackend.DiscoverOption{
	natsbackend.WithHeartbeat(700 * time.Millisecond),
	natsbackend.WithProbeTimeout(5 * time.Second),
	natsbackend.WithTimeout(5 * time.Second),
}

func embedReq(in []api.EmbedInput) api.EmbedRequest {
	return api.EmbedRequest{Model: "tiny", Inputs: in}
}

// sameEmbeddings fails the test unless got is want: the model, the token
// count and every vector bit for bit.
func sameEmbeddings(t *testing.T, what string, got, want *api.Embeddings) {
	t.Helper()
	if got.Model != want.Model || got.PromptTokens != want.PromptTokens || len(got.Vectors) != len(want.Vectors) {
		t.Fatalf("%s: model %q, %d tokens, %d vectors; want %q, %d, %d", what, got.Model, got.PromptTokens, len(got.Vectors),
			want.Model, want.PromptTokens, len(want.Vectors))
	}
	for i := range want.Vectors {
		g, w := got.Vectors[i], want.Vectors[i]
		if len(g) != len(w) {
			t.Fatalf("%s: vector %d has %d values, want %d", what, i, len(g), len(w))
		}
		for j := range w {
			if g[j] != w[j] {
				t.Fatalf("%s: vector %d value %d is %v, want %v", what, i, j, g[j], w[j])
			}
		}
	}
}

// TestEmbedOverNATS: texts and token ids embedded on either instance over
// NATS, or through the balancer, are the Server's vectors bit for bit,
// with Matryoshka dimensions.
func TestEmbedOverNATS(t *testing.T) {
	n := startNATS(t)
	sim := []enginetest.SimOption{enginetest.WithEmbedding(64, engine.PoolMean, true, true)}
	a := startInstance(t, n, "a", sim...)
	startInstance(t, n, "b", sim...)
	lb, d := newBalancer(t, n)
	waitInstances(t, d, "a", "b")
	for _, dims := range []int{0, 16} {
		req := embedReq(embedInputs(7, 40))
		req.Dimensions = dims
		want, err := a.srv.Embed(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"a", "b"} {
			got, err := client(t, d, name).Embed(context.Background(), req)
			if err != nil {
				t.Fatalf("on %s: %v", name, err)
			}
			sameEmbeddings(t, fmt.Sprintf("dimensions %d on %s", dims, name), got, want)
		}
		got, err := lb.Embed(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		sameEmbeddings(t, fmt.Sprintf("dimensions %d through the balancer", dims), got, want)
	}
}

// TestEmbedOverMaxPayload: under a small NATS max_payload, a request too
// large for one message goes as several, and the vectors come back in
// parts; they are the Server's all the same.
func TestEmbedOverMaxPayload(t *testing.T) {
	const maxPayload = 32 << 10
	n := startNATSWith(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	a := startInstance(t, n, "a", enginetest.WithEmbedding(1024, engine.PoolLast, true, false))
	_, d := newBalancer(t, n, slowMachine...)
	waitInstances(t, d, "a")

	// Count the requests to the embed endpoint and the messages of parts.
	spy := n.connect(t, "spy")
	var requests, parts, biggest atomic.Int64
	if _, err := spy.Subscribe("mlxserving.*.embed", func(*nats.Msg) { requests.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if _, err := spy.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if len(m.Data) > 0 && m.Data[0] == 'v' {
			parts.Add(1)
			if s := int64(len(m.Data)); s > biggest.Load() {
				biggest.Store(s)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	req := embedReq(embedInputs(300, 200)) // about 50 KiB of JSON
	want, err := a.srv.Embed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := client(t, d, "a").Embed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	sameEmbeddings(t, "in parts", got, want)
	waitFor(t, "the spy's messages", func() bool { return requests.Load() >= 2 && parts.Load() >= 300*4096/maxPayload })
	if biggest.Load() > maxPayload {
		t.Errorf("a part of %d bytes, over the max_payload", biggest.Load())
	}

	// A refusal names the input as the caller counts them, whichever
	// request of the several it was in.
	bad := embedReq(embedInputs(300, 200))
	bad.Inputs[250] = api.EmbedInput{}
	_, err = client(t, d, "a").Embed(context.Background(), bad)
	var ip *api.InvalidParamError
	if !errors.As(err, &ip) || ip.Param != "input[250]" || !strings.Contains(err.Error(), "input[250]") {
		t.Fatalf("an empty input 250: %v, want an *api.InvalidParamError for input[250]", err)
	}

	// One input too big for any message is refused, as bad input.
	huge := embedReq([]api.EmbedInput{{Text: strings.Repeat("x", maxPayload)}})
	_, err = client(t, d, "a").Embed(context.Background(), huge)
	if !errors.As(err, &ip) || ip.Param != "input" || retry.Classify(err).Retryable() {
		t.Fatalf("an input over the max_payload: %v, want a not retryable *api.InvalidParamError", err)
	}
}

// TestEmbedMaxInputs: OpenAI's limit of 2048 inputs of 1024 values (8 MiB
// of vectors) crosses the default 1 MiB max_payload.
func TestEmbedMaxInputs(t *testing.T) {
	if testing.Short() {
		t.Skip("2048 inputs")
	}
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithEmbedding(1024, engine.PoolMean, true, false))
	_, d := newBalancer(t, n, slowMachine...)
	waitInstances(t, d, "a")
	req := embedReq(embedInputs(api.MaxEmbedInputs, 30))
	want, err := a.srv.Embed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := client(t, d, "a").Embed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	sameEmbeddings(t, "2048 inputs", got, want)
}

// TestEmbedTypedErrors: the instance's refusals arrive as the same typed
// errors, not retryable where another instance would refuse as well.
func TestEmbedTypedErrors(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a", enginetest.WithEmbedding(32, engine.PoolLast, true, false))
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	c := client(t, d, "a")
	ctx := context.Background()

	invalid := func(what string, req api.EmbedRequest, param string) {
		t.Helper()
		_, err := c.Embed(ctx, req)
		var ip *api.InvalidParamError
		if !errors.As(err, &ip) || !strings.HasPrefix(ip.Param, param) || !errors.Is(err, api.ErrInvalidParam) || retry.Classify(err).Retryable() {
			t.Errorf("%s: %v, want a not retryable *api.InvalidParamError for %s", what, err, param)
		}
	}
	invalid("no inputs", embedReq(nil), "input")
	invalid("an empty input", embedReq([]api.EmbedInput{{Text: "a"}, {}}), "input")
	dims := embedReq(embedInputs(1, 10))
	dims.Dimensions = 8
	invalid("dimensions of a model that is not Matryoshka", dims, "dimensions")

	long := make([]int32, testmodel.Tiny().ContextLength+5)
	for i := range long {
		long[i] = 3
	}
	_, err := c.Embed(ctx, embedReq([]api.EmbedInput{{Tokens: long}}))
	var cl *engine.ContextLengthError
	if !errors.As(err, &cl) || cl.Prompt != len(long) || cl.Limit != testmodel.Tiny().ContextLength {
		t.Errorf("an input over the context: %v, want a *engine.ContextLengthError with its numbers", err)
	}
	if _, err := c.Embed(ctx, api.EmbedRequest{Model: "nope", Inputs: embedInputs(1, 5)}); !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("an unknown model: %v", err)
	}
}

// TestEmbedRateLimited: a client over its rate gets the instance's
// *scheduler.RateLimitError, with its retry-after.
func TestEmbedRateLimited(t *testing.T) {
	n := startNATS(t)
	startServerOn(t, "a", n.connect(t, "a"), []mlxserving.Option{mlxserving.WithSchedulerOptions(scheduler.WithRateLimit(0.01, 1))},
		enginetest.WithEmbedding(32, engine.PoolLast, true, false))
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	c := client(t, d, "a")
	limited := embedReq(embedInputs(2, 10))
	limited.Client = "k"
	if _, err := c.Embed(context.Background(), limited); err != nil {
		t.Fatal(err)
	}
	_, err := c.Embed(context.Background(), limited)
	var rl *scheduler.RateLimitError
	if d, ok := retry.RetryAfter(err); !errors.As(err, &rl) || !ok || d <= 0 {
		t.Errorf("over the rate: %v, want a *scheduler.RateLimitError with a retry-after", err)
	}
}

// TestEmbedFailsOver: the instance an embedding request runs on dies (its
// connection gone, as kill -9 leaves it) or stops; the balancer sends the
// request to the other instance, and the caller gets every vector.
func TestEmbedFailsOver(t *testing.T) {
	for _, how := range []string{"killed", "stopped"} {
		t.Run(how, func(t *testing.T) {
			n := startNATS(t)
			sim := []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(1),
				enginetest.WithEmbedding(32, engine.PoolMean, true, false)}
			ins := map[string]*instance{"a": startInstance(t, n, "a", sim...), "b": startInstance(t, n, "b", sim...)}
			lb, d := newBalancer(t, n, natsbackend.WithHeartbeat(2*time.Second), natsbackend.WithTimeout(10*time.Second))
			waitInstances(t, d, "a", "b")
			req := embedReq(embedInputs(200, 20)) // a second of steps
			want, err := ins["a"].srv.Embed(context.Background(), embedReq(req.Inputs[:1]))
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				res *api.Embeddings
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := lb.Embed(context.Background(), req)
				done <- result{res, err}
			}()
			var on *instance
			waitFor(t, "the request running", func() bool {
				for _, in := range ins {
					if in.sim.Stats().OpenSequences > 0 {
						on = in
						return true
					}
				}
				return false
			})
			other := ins["a"]
			if on == other {
				other = ins["b"]
			}
			cut := time.Now()
			if how == "killed" {
				on.nc.Close() // no goodbye
			} else {
				_ = on.svc.Stop()
			}
			waitFor(t, "the request on the other instance", func() bool { return other.sim.Stats().OpenSequences > 0 })
			// Well before the 6 s three missed heartbeats would take: the
			// probes (killed) or the instance's own message (stopped).
			if took := time.Since(cut); took > 2*time.Second {
				t.Errorf("failed over %v after the instance was %s", took, how)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("after %s was %s: %v", on.name, how, r.err)
			}
			if len(r.res.Vectors) != len(req.Inputs) {
				t.Fatalf("%d vectors for %d inputs", len(r.res.Vectors), len(req.Inputs))
			}
			sameEmbeddings(t, "the first input", &api.Embeddings{Model: r.res.Model, Vectors: r.res.Vectors[:1], PromptTokens: want.PromptTokens}, want)
			if stats := lb.Stats(); stats.Failovers == 0 {
				t.Errorf("no failover counted: %+v", stats)
			}
		})
	}
}

// TestEmbedCancel: a caller's deadline ends the request on the instance
// too: its sequences are cancelled.
func TestEmbedCancel(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(1),
		enginetest.WithEmbedding(32, engine.PoolMean, true, false))
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := client(t, d, "a").Embed(ctx, embedReq(embedInputs(400, 20)))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("past the deadline: %v", err)
	}
	waitFor(t, "the sequences cancelled", func() bool { return a.sim.Stats().OpenSequences == 0 && a.srv.Load().Waiting == 0 })
}

// TestEmbedDrain: an instance drained while it embeds (advertised as
// draining, then gone from discovery) finishes the request before it
// stops.
func TestEmbedDrain(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(1),
		enginetest.WithEmbedding(32, engine.PoolMean, true, false))
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	c := client(t, d, "a")
	done := make(chan error, 1)
	go func() {
		res, err := c.Embed(context.Background(), embedReq(embedInputs(100, 20)))
		if err == nil && len(res.Vectors) != 100 {
			err = fmt.Errorf("%d vectors for 100 inputs", len(res.Vectors))
		}
		done <- err
	}()
	waitFor(t, "the request running", func() bool { return a.sim.Stats().OpenSequences > 0 })
	drained := make(chan error, 1)
	go func() { drained <- a.svc.Drain(context.Background(), 150*time.Millisecond) }()
	if err := <-done; err != nil {
		t.Fatalf("drained while embedding: %v", err)
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	waitInstances(t, d)
}

// TestEmbedBadRequests: malformed embed requests get a typed error reply
// and the instance keeps serving.
func TestEmbedBadRequests(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a")
	nc := n.connect(t, "raw")
	subj := endpoint(t, nc, "embed")
	for _, tc := range []struct{ name, data, timeout string }{
		{"no stream header", `{"Model":"tiny","Inputs":[{"Text":"x"}]}`, "-"},
		{"not json", `{{{`, ""},
		{"wrong types", `{"Model":5}`, ""},
		{"a bad timeout", `{"Model":"tiny","Inputs":[{"Text":"x"}]}`, "soon"},
	} {
		msg := nats.NewMsg(subj)
		msg.Data = []byte(tc.data)
		if tc.timeout != "-" {
			msg.Header.Set("Mlx-Stream", nc.NewInbox())
		}
		if tc.timeout != "" && tc.timeout != "-" {
			msg.Header.Set("Mlx-Timeout", tc.timeout)
		}
		reply, err := nc.RequestMsg(msg, 2*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if reply.Header.Get("Mlx-Kind") != "error" || !strings.Contains(string(reply.Data), `"code":"invalid_value"`) {
			t.Errorf("%s: reply %v %s", tc.name, reply.Header, reply.Data)
		}
	}
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	if res, err := client(t, d, "a").Embed(t.Context(), embedReq(embedInputs(2, 10))); err != nil || len(res.Vectors) != 2 {
		t.Fatalf("after bad requests: %+v %v", res, err)
	}
}

// TestEmbedOlderInstance: an instance of a version without the embed
// endpoint refuses embeddings with a retryable error wrapping
// errors.ErrUnsupported, and a balancer takes them to an instance that
// embeds.
func TestEmbedOlderInstance(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a")
	old := n.connect(t, "old")
	svc, err := micro.AddService(old, micro.Config{Name: natsbackend.DefaultService, Version: "0.9.0",
		Metadata: map[string]string{"instance": "old"},
		StatsHandler: func(e *micro.Endpoint) any {
			if e.Name != "load" {
				return nil
			}
			return balancer.Load{Models: []string{"tiny"}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	g := svc.AddGroup("mlxserving."+svc.Info().ID, micro.WithGroupQueueGroupDisabled())
	refuse := micro.HandlerFunc(func(r micro.Request) { _ = r.Error("500", "not in this test", nil) })
	for _, e := range []string{"generate", "chat", "load"} {
		if err := g.AddEndpoint(e, refuse); err != nil {
			t.Fatal(err)
		}
	}
	lb, d := newBalancer(t, n)
	waitInstances(t, d, "a", "old")
	_, err = client(t, d, "old").Embed(t.Context(), embedReq(embedInputs(1, 5)))
	if !errors.Is(err, errors.ErrUnsupported) || !retry.Classify(err).Retryable() {
		t.Fatalf("embed on an older instance: %v, want a retryable error wrapping errors.ErrUnsupported", err)
	}
	for range 4 {
		if res, err := lb.Embed(t.Context(), embedReq(embedInputs(2, 5))); err != nil || len(res.Vectors) != 2 {
			t.Fatalf("through the balancer beside an older instance: %+v, %v", res, err)
		}
	}
	if s := lb.Stats(); s.Failovers == 0 {
		t.Errorf("no request tried the older instance first: %+v", s)
	}
}
