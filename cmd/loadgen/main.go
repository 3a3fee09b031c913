// Command loadgen replays a synthetic workload against an OpenAI-compatible
// server on this machine and reports, with vLLM's benchmark definitions,
// time to first token (TTFT), time per output token (TPOT), inter-token
// latency (ITL) and end-to-end latency percentiles, request and token
// throughput, and goodput against SLOs.
//
//	go run ./examples/server &
//	go run ./cmd/loadgen -requests 200 -concurrency 16 -max-tokens 64
//	go run ./cmd/loadgen -requests 500 -rate 20 -slo-ttft 200ms -slo-tpot 20ms
//	go run ./cmd/loadgen -endpoint embeddings -inputs 8 -input-words 96 -concurrency 64
//
// With -endpoint embeddings each request embeds -inputs texts of
// -input-words words; its time to first token is its whole latency and
// the summary adds inputs embedded per second.
//
// A closed loop starts its -concurrency clients at once, so the first
// prompts queue behind each other and the run's TTFT percentiles carry
// that start; -ramp D starts them evenly over D, as users arrive at a
// service (report both when it matters). Its requests all ask for
// -max-tokens (ignore_eos), so clients that start together finish
// together and their next prompts arrive in waves; -range-ratio R draws
// each request's prompt words and output tokens uniformly within R of
// -input-words and -max-tokens (vLLM's --random-range-ratio), as a real
// workload's lengths vary (again, report both).
//
// Every run is bounded: at most -requests requests and -duration of time;
// requests still in flight when -duration ends are cancelled and reported
// as cut, apart from the failed ones.
// Only loopback targets are accepted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := mainErr(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func mainErr(ctx context.Context, args []string, out io.Writer) error {
	cfg, goal, pcts, asJSON, err := parseFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.concurrency, MaxConnsPerHost: 0}}
	defer client.CloseIdleConnections()
	if cfg.model == "" {
		if cfg.model, err = firstModel(ctx, client, cfg.target); err != nil {
			return err
		}
	}
	results, elapsed, sending := run(ctx, client, cfg)
	s := summarize(results, elapsed, goal, pcts)
	if cfg.endpoint == "embeddings" {
		s.InputThroughput = s.RequestThroughput * float64(cfg.inputs)
	}
	if cfg.rate > 0 && sending > 0 && len(results) > 1 {
		s.OfferedRate = float64(len(results)-1) / sending.Seconds()
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	fmt.Fprintf(out, "target %s  model %s  endpoint %s  stream %v  requests %d  concurrency %d  rate %v/s  ramp %v  input %d words  output %d tokens  range ratio %v\n",
		cfg.target, cfg.model, cfg.endpoint, cfg.stream, cfg.requests, cfg.concurrency, cfg.rate, cfg.ramp, cfg.inputWords, cfg.maxTokens, cfg.rangeRatio)
	s.print(out, goal)
	return nil
}

func parseFlags(args []string) (cfg config, goal slo, pcts []float64, asJSON bool, err error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	target := fs.String("url", "http://127.0.0.1:8080", "server base URL (loopback only)")
	fs.StringVar(&cfg.endpoint, "endpoint", "chat", "chat, completions or embeddings")
	fs.IntVar(&cfg.inputs, "inputs", 1, "inputs per embeddings request (-endpoint embeddings)")
	fs.StringVar(&cfg.model, "model", "", "model id, or ids separated by commas that requests take in turn (LoRA adapters and their base; default: the first of /v1/models)")
	fs.IntVar(&cfg.requests, "requests", 100, "number of requests to send (1 to 1000000)")
	fs.DurationVar(&cfg.duration, "duration", time.Minute, "time limit for the whole run (at most 1h)")
	fs.IntVar(&cfg.concurrency, "concurrency", 8, "most requests in flight")
	fs.Float64Var(&cfg.rate, "rate", 0, "Poisson arrival rate in requests/s (0: closed loop at -concurrency)")
	fs.DurationVar(&cfg.ramp, "ramp", 0, "closed loop: start the -concurrency clients evenly over this time rather than all at once")
	fs.IntVar(&cfg.inputWords, "input-words", 32, "prompt length in words")
	fs.IntVar(&cfg.prompts, "prompts", 0, "repeat this many distinct prompts in turn, to measure prefix caching (0: every request its own random prompt)")
	fs.IntVar(&cfg.maxTokens, "max-tokens", 64, "tokens to generate per request (ignore_eos is set)")
	fs.Float64Var(&cfg.rangeRatio, "range-ratio", 0, "each request's prompt words and output tokens drawn uniformly within this fraction either side of -input-words and -max-tokens, 0 to below 1 (0: exactly those)")
	fs.BoolVar(&cfg.stream, "stream", true, "stream responses over SSE")
	fs.Float64Var(&cfg.temperature, "temperature", 0, "sampling temperature of every request, 0 to 2 (0: greedy; OpenAI clients default to 1)")
	fs.StringVar(&cfg.priority, "priority", "", "priority tier sent with every request")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed for arrival times")
	fs.DurationVar(&goal.ttft, "slo-ttft", 0, "goodput SLO on time to first token (0: none)")
	fs.DurationVar(&goal.tpot, "slo-tpot", 0, "goodput SLO on time per output token (0: none)")
	fs.DurationVar(&goal.e2e, "slo-e2e", 0, "goodput SLO on end-to-end latency (0: none)")
	pctList := fs.String("percentiles", "50,90,99", "latency percentiles to report")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON")
	if err = fs.Parse(args); err != nil {
		return
	}
	if fs.NArg() > 0 {
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
		return
	}
	if cfg.target, err = url.Parse(*target); err != nil {
		return
	}
	if err = checkLoopback(cfg.target); err != nil {
		return
	}
	if pcts, err = parsePercentiles(*pctList); err != nil {
		return
	}
	err = cfg.validate()
	return
}

func (c config) validate() error {
	switch {
	case c.endpoint != "chat" && c.endpoint != "completions" && c.endpoint != "embeddings":
		return fmt.Errorf("-endpoint %q: want chat, completions or embeddings", c.endpoint)
	case c.inputs < 1 || c.inputs > 2048:
		return fmt.Errorf("-inputs %d: want 1 to 2048", c.inputs)
	case c.requests < 1 || c.requests > 1_000_000:
		return fmt.Errorf("-requests %d: want 1 to 1000000", c.requests)
	case c.duration <= 0 || c.duration > time.Hour:
		return fmt.Errorf("-duration %v: want more than 0, at most 1h", c.duration)
	case c.concurrency < 1 || c.concurrency > 100_000:
		return fmt.Errorf("-concurrency %d: want 1 to 100000", c.concurrency)
	case c.rate < 0:
		return fmt.Errorf("-rate %v: want 0 or more", c.rate)
	case c.ramp < 0 || c.ramp > 0 && c.rate > 0 || c.ramp >= c.duration:
		return fmt.Errorf("-ramp %v: want 0 or more, shorter than -duration, and no -rate (Poisson arrivals have no ramp)", c.ramp)
	case c.temperature < 0 || c.temperature > 2:
		return fmt.Errorf("-temperature %v: want 0 to 2", c.temperature)
	case c.prompts < 0:
		return errors.New("-prompts must be 0 or more")
	case c.inputWords < 1 || c.maxTokens < 1:
		return errors.New("-input-words and -max-tokens must be at least 1")
	case !(c.rangeRatio >= 0 && c.rangeRatio < 1): // NaN too
		return fmt.Errorf("-range-ratio %v: want 0 to below 1", c.rangeRatio)
	}
	return nil
}

func parsePercentiles(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		p, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || p < 0 || p > 100 {
			return nil, fmt.Errorf("-percentiles: %q is not a number from 0 to 100", f)
		}
		out = append(out, p)
	}
	return out, nil
}

// firstModel asks the server which models it serves.
func firstModel(ctx context.Context, client *http.Client, target *url.URL) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.JoinPath("/v1/models").String(), nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return "", fmt.Errorf("GET /v1/models: %w", err)
	}
	if len(list.Data) == 0 {
		return "", errors.New("the server has no models loaded")
	}
	return list.Data[0].ID, nil
}
