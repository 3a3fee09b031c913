package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// outcome is how a streamed request ended, as its client saw it.
type outcome int

const (
	completed   outcome = iota // every token, then data: [DONE]
	refused                    // an error status: no stream at all
	failedEarly                // a stream that ended before its first token
	interrupted                // a stream cut after some tokens
)

// phase collects the requests that ended while it was current: those a
// fault cut or sent elsewhere count in the fault's phase.
type phase struct {
	name string
	// from and to bound the phase, to count what the gateway logged.
	from, to time.Time
	mu       sync.Mutex
	results  []result
	// leftAfter is how long after the fault the instance left the
	// gateway's rotation (0: not measured in this phase).
	leftAfter time.Duration
}

type result struct {
	outcome outcome
	ttft    time.Duration // 0 without a first token
	tokens  int
	// chunks counts the stream's chunks: the first is the first token's
	// (whose text may be empty: an end of sequence), the last has the
	// finish reason.
	chunks   int
	finished bool
	// resumes is how many times the gateway resumed the stream on another
	// instance (its ": finished … resumes=N" comment); wait is the
	// longest the client waited between two chunks, which for a resumed
	// stream is the resume gap as the client saw it.
	resumes int
	wait    time.Duration
}

func (p *phase) add(r result) {
	p.mu.Lock()
	p.results = append(p.results, r)
	p.mu.Unlock()
}

// summary is a phase's counts and TTFT percentiles.
type summary struct {
	requests, completed, refused, failedEarly, interrupted int
	tokens                                                 int
	p50, p99                                               time.Duration
	// resumed counts the streams resumed on another instance; gapP50,
	// gapP99 and gapMax are their longest waits between two chunks.
	resumed                int
	gapP50, gapP99, gapMax time.Duration
}

func (p *phase) summary() summary {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := summary{requests: len(p.results)}
	var ttfts, gaps []time.Duration
	for _, r := range p.results {
		s.tokens += r.tokens
		if r.resumes > 0 {
			s.resumed++
			gaps = append(gaps, r.wait)
		}
		switch r.outcome {
		case completed:
			s.completed++
		case refused:
			s.refused++
		case failedEarly:
			s.failedEarly++
		case interrupted:
			s.interrupted++
		}
		if r.ttft > 0 {
			ttfts = append(ttfts, r.ttft)
		}
	}
	s.p50, s.p99, _ = percentiles(ttfts)
	s.gapP50, s.gapP99, s.gapMax = percentiles(gaps)
	return s
}

// percentiles sorts ds and returns its p50, p99 and maximum (zeros when
// empty).
func percentiles(ds []time.Duration) (p50, p99, top time.Duration) {
	slices.Sort(ds)
	n := len(ds)
	if n == 0 {
		return 0, 0, 0
	}
	return ds[n/2], ds[min(n-1, n*99/100)], ds[n-1]
}

// load is streaming clients sending completions through the gateway one
// after another, each request counted in the phase current when it ended.
type load struct {
	url     string
	body    []byte
	client  *http.Client
	current atomic.Pointer[phase]
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// newLoad prepares clients streaming completions of maxTokens tokens.
func newLoad(gwURL string, clients, maxTokens int) *load {
	return &load{url: gwURL + "/v1/completions",
		body:   fmt.Appendf(nil, `{"model":"tiny","prompt":"Once upon a time","max_tokens":%d,"stream":true}`, maxTokens),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}}
}

// startLoad starts the clients; their requests count in first until
// current changes.
func startLoad(gwURL string, clients, maxTokens int, first *phase) *load {
	l := newLoad(gwURL, clients, maxTokens)
	l.current.Store(first)
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for range clients {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				r := l.request()
				l.current.Load().add(r)
			}
		})
	}
	return l
}

// stop lets every request in flight finish and stops the clients.
func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
	l.client.CloseIdleConnections()
}

// request sends one streamed completion and reads it to its end.
func (l *load) request() result {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(l.body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return result{outcome: refused}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return result{outcome: refused}
	}
	var r result
	var last time.Time
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		text := sc.Text()
		if v := field(text, "resumes"); strings.HasPrefix(text, ": finished") && v != "" {
			r.resumes, _ = strconv.Atoi(v)
		}
		data, ok := strings.CutPrefix(text, "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			if r.finished {
				r.outcome = completed
				return r
			}
			return r.cut()
		case strings.HasPrefix(data, `{"error"`):
			if strings.Contains(data, "stream interrupted") {
				// Tokens were generated, and the error reached the client
				// before the chunk that held them: cut mid-stream (a
				// kill -9 of the instance), not a request failed before
				// its first token.
				r.outcome = interrupted
				return r
			}
			return r.cut()
		case strings.Contains(data, `"choices"`):
			now := time.Now()
			if r.chunks == 0 {
				r.ttft = now.Sub(began)
			} else {
				r.wait = max(r.wait, now.Sub(last))
			}
			last = now
			r.chunks++
			if strings.Contains(data, `"text":"`) && !strings.Contains(data, `"text":""`) {
				r.tokens++
			}
			r.finished = r.finished || !strings.Contains(data, `"finish_reason":null`)
		}
	}
	return r.cut() // the connection ended without [DONE]
}

func (r result) cut() result {
	if r.chunks > 0 {
		r.outcome = interrupted
	} else {
		r.outcome = failedEarly
	}
	return r
}
