package openai_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

const benchTokens = 256

// BenchmarkStreamOverhead compares one streamed request of 256 tokens read
// through the HTTP/SSE layer with the same request read from the Server
// directly, on the same simulated engine (zero step time) in the same run.
// ns/token of "http" minus "direct" is the HTTP/SSE cost per token.
func BenchmarkStreamOverhead(b *testing.B) {
	f := newFixture(b, fixtureOpts{})
	b.Run("direct", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			st, err := f.srv.Generate(ctx, api.Request{Model: "tiny", PromptTokens: []int32{1, 2, 3, 4},
				Params: api.Params{MaxTokens: benchTokens, IgnoreEOS: true}})
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for c, err := range st.Chunks() {
				if err != nil {
					b.Fatal(err)
				}
				if c.HasToken {
					n++
				}
			}
			if n != benchTokens {
				b.Fatalf("%d tokens", n)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchTokens), "ns/token")
	})
	b.Run("http", func(b *testing.B) {
		body := fmt.Sprintf(`{"model":"tiny","prompt":[1,2,3,4],"max_tokens":%d,"ignore_eos":true,"stream":true}`, benchTokens)
		client := f.ts.Client()
		for b.Loop() {
			resp, err := client.Post(f.ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			events := 0
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					events++
				}
			}
			resp.Body.Close()
			if events < benchTokens/2 {
				b.Fatalf("%d events", events)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchTokens), "ns/token")
	})
}

// BenchmarkCompletionsSmall measures the requests/s the handler sustains
// for small non-streamed completions (4 prompt tokens, 4 generated) on the
// simulated engine with zero step time, from 64 concurrent clients.
func BenchmarkCompletionsSmall(b *testing.B) {
	f := newFixture(b, fixtureOpts{})
	body := `{"model":"tiny","prompt":[1,2,3,4],"max_tokens":4,"ignore_eos":true}`
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	b.SetParallelism(64 / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(f.ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkIdleStreams opens 5,000 streaming requests that wait on an
// engine step that does not end, and reports the memory (heap in use plus
// goroutine stacks) each idle open stream costs the process. The clients
// are raw loopback connections that only send their request, so what is
// measured is the server side plus one net.Conn per stream.
func BenchmarkIdleStreams(b *testing.B) {
	const streams = 5000
	for b.Loop() {
		f := newFixture(b, fixtureOpts{sim: []enginetest.SimOption{enginetest.WithStepTime(time.Hour, 0), enginetest.WithMaxBatch(8)}})
		addr := strings.TrimPrefix(f.ts.URL, "http://")
		body := `{"model":"tiny","prompt":[1,2,3,4],"max_tokens":16,"stream":true}`
		req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
		before := memInUse()
		conns := make([]net.Conn, 0, streams)
		for range streams {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
			if _, err := io.WriteString(c, req); err != nil {
				b.Fatal(err)
			}
		}
		waitFor(b, "every stream to be queued or running", func() bool {
			st := f.srv.Stats()["tiny"]
			return st.Batcher.Running+st.Queue.Queued == streams
		})
		after := memInUse()
		b.ReportMetric(float64(after-before)/streams, "B/stream")
		b.ReportMetric(float64(runtime.NumGoroutine())/streams, "goroutines/stream")
		for _, c := range conns {
			_ = c.Close()
		}
		// Queued streams leave the queue at once; the 8 in the batch are
		// freed when the fixture's cleanup ends the hour-long step.
		waitFor(b, "the queued streams to be cancelled", func() bool { return f.srv.Stats()["tiny"].Queue.Queued == 0 })
	}
}

func memInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}
