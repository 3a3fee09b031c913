package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// result is one request's measurements.
type result struct {
	err          error
	start        time.Time
	ttft         time.Duration // send to first content chunk (to the end when none carried text)
	textless     bool          // no chunk carried text: ttft is the time to the finish chunk
	cut          bool          // err came from the run's own deadline (-duration) while it was in flight
	e2e          time.Duration // send to the end of the response
	itl          []time.Duration
	promptTokens int
	outputTokens int
}

// tpot is the mean time per output token after the first, as vLLM defines
// it: (e2e - ttft) / (output tokens - 1). ok is false for one-token outputs.
func (r *result) tpot() (time.Duration, bool) {
	if r.outputTokens < 2 || r.textless {
		return 0, false
	}
	return (r.e2e - r.ttft) / time.Duration(r.outputTokens-1), true
}

// slo holds the goodput targets; zero fields are not checked.
type slo struct {
	ttft, tpot, e2e time.Duration
}

func (s slo) met(r *result) bool {
	if r.err != nil {
		return false
	}
	if s.ttft > 0 && r.ttft > s.ttft {
		return false
	}
	if tp, ok := r.tpot(); s.tpot > 0 && ok && tp > s.tpot {
		return false
	}
	return s.e2e == 0 || r.e2e <= s.e2e
}

// summary is the report over a run, with vLLM's benchmark definitions.
type summary struct {
	Completed, Failed        int
	Cut                      int // in flight when -duration ended: neither completed nor failed
	Duration                 time.Duration
	PromptTokens, OutputToks int
	RequestThroughput        float64 // completed requests per second
	OutputThroughput         float64 // output tokens per second
	TotalThroughput          float64 // prompt + output tokens per second
	InputThroughput          float64 // inputs embedded per second (-endpoint embeddings)
	Goodput                  float64 // requests per second meeting every SLO
	GoodRequests             int
	// OfferedRate is the arrival rate the run realised with -rate: the
	// requests sent after the first over the time to the last send (a
	// seeded Poisson process offers a little more or less than -rate).
	OfferedRate          float64
	TTFT, TPOT, ITL, E2E dist
	FirstError           string
	// Textless counts completed streams none of whose chunks carried text
	// (every token decoded to nothing): their TTFT is their end, and they
	// have no TPOT.
	Textless int
}

// dist is a latency distribution: mean, median and chosen percentiles.
type dist struct {
	N           int
	Mean, Std   time.Duration
	Percentiles []float64
	Values      []time.Duration // one per percentile
}

func newDist(xs []time.Duration, pcts []float64) dist {
	d := dist{N: len(xs), Percentiles: pcts, Values: make([]time.Duration, len(pcts))}
	if len(xs) == 0 {
		return d
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum, sq float64
	for _, x := range s {
		sum += float64(x)
	}
	mean := sum / float64(len(s))
	for _, x := range s {
		sq += (float64(x) - mean) * (float64(x) - mean)
	}
	d.Mean, d.Std = time.Duration(mean), time.Duration(math.Sqrt(sq/float64(len(s))))
	for i, p := range pcts {
		d.Values[i] = percentile(s, p)
	}
	return d
}

// percentile interpolates linearly between closest ranks (numpy's default,
// which vLLM's benchmark uses). s must be sorted.
func percentile(s []time.Duration, p float64) time.Duration {
	if len(s) == 1 {
		return s[0]
	}
	rank := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(rank))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	frac := rank - float64(lo)
	return s[lo] + time.Duration(frac*float64(s[lo+1]-s[lo]))
}

func summarize(results []*result, elapsed time.Duration, goal slo, pcts []float64) summary {
	s := summary{Duration: elapsed}
	var ttft, tpot, itl, e2e []time.Duration
	for _, r := range results {
		if r.cut {
			s.Cut++
			continue
		}
		if r.err != nil {
			s.Failed++
			if s.FirstError == "" {
				s.FirstError = r.err.Error()
			}
			continue
		}
		s.Completed++
		if r.textless {
			s.Textless++
		}
		s.PromptTokens += r.promptTokens
		s.OutputToks += r.outputTokens
		ttft, e2e = append(ttft, r.ttft), append(e2e, r.e2e)
		itl = append(itl, r.itl...)
		if tp, ok := r.tpot(); ok {
			tpot = append(tpot, tp)
		}
		if goal.met(r) {
			s.GoodRequests++
		}
	}
	if secs := elapsed.Seconds(); secs > 0 {
		s.RequestThroughput = float64(s.Completed) / secs
		s.OutputThroughput = float64(s.OutputToks) / secs
		s.TotalThroughput = float64(s.PromptTokens+s.OutputToks) / secs
		s.Goodput = float64(s.GoodRequests) / secs
	}
	s.TTFT, s.TPOT, s.ITL, s.E2E = newDist(ttft, pcts), newDist(tpot, pcts), newDist(itl, pcts), newDist(e2e, pcts)
	return s
}

func (s summary) print(w io.Writer, goal slo) {
	fmt.Fprintf(w, "Successful requests:            %d\n", s.Completed)
	fmt.Fprintf(w, "Failed requests:                %d\n", s.Failed)
	if s.FirstError != "" {
		fmt.Fprintf(w, "First error:                    %s\n", s.FirstError)
	}
	if s.Cut > 0 {
		fmt.Fprintf(w, "Cut at -duration:               %d (in flight when the run ended: neither completed nor failed)\n", s.Cut)
	}
	if s.Textless > 0 {
		fmt.Fprintf(w, "Streams without text:           %d (TTFT counted to their end, no TPOT)\n", s.Textless)
	}
	fmt.Fprintf(w, "Benchmark duration (s):         %.2f\n", s.Duration.Seconds())
	fmt.Fprintf(w, "Total input tokens:             %d\n", s.PromptTokens)
	fmt.Fprintf(w, "Total generated tokens:         %d\n", s.OutputToks)
	if s.OfferedRate > 0 {
		fmt.Fprintf(w, "Offered request rate (req/s):   %.2f\n", s.OfferedRate)
	}
	fmt.Fprintf(w, "Request throughput (req/s):     %.2f\n", s.RequestThroughput)
	if s.InputThroughput > 0 {
		fmt.Fprintf(w, "Embedding throughput (inputs/s): %.2f\n", s.InputThroughput)
	}
	fmt.Fprintf(w, "Output token throughput (tok/s): %.2f\n", s.OutputThroughput)
	fmt.Fprintf(w, "Total token throughput (tok/s): %.2f\n", s.TotalThroughput)
	if goal != (slo{}) {
		fmt.Fprintf(w, "Goodput (req/s):                %.2f (%d of %d requests met %s)\n", s.Goodput, s.GoodRequests, s.Completed+s.Failed, goal)
	}
	for _, m := range []struct {
		name string
		d    dist
	}{{"Time to First Token", s.TTFT}, {"Time per Output Token (excl. 1st token)", s.TPOT}, {"Inter-token Latency", s.ITL}, {"End-to-end Latency", s.E2E}} {
		fmt.Fprintf(w, "---- %s (ms, n=%d) ----\n", m.name, m.d.N)
		fmt.Fprintf(w, "  mean %.3f  std %.3f", ms(m.d.Mean), ms(m.d.Std))
		for i, p := range m.d.Percentiles {
			fmt.Fprintf(w, "  p%s %.3f", strings.TrimSuffix(fmt.Sprintf("%g", p), ".0"), ms(m.d.Values[i]))
		}
		fmt.Fprintln(w)
	}
}

func (s slo) String() string {
	var parts []string
	if s.ttft > 0 {
		parts = append(parts, "ttft<="+s.ttft.String())
	}
	if s.tpot > 0 {
		parts = append(parts, "tpot<="+s.tpot.String())
	}
	if s.e2e > 0 {
		parts = append(parts, "e2e<="+s.e2e.String())
	}
	return strings.Join(parts, " ")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
