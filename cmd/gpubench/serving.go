package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The serving mode runs the stack as a user does: examples/server on the
// checkpoint at its own full context (nothing overridden), driven over HTTP
// by cmd/loadgen at several loads, with the server's own metrics scraped
// around every load for the mean running batch and queue wait.

// load is one row of the serving table: a closed loop at a concurrency, or
// Poisson arrivals at a rate.
type load struct {
	name        string
	concurrency int
	rate        float64
	requests    int
}

// parseLoads reads "c1:50,c16:200,r40:800": cN is N clients in a closed
// loop, rN Poisson arrivals at N requests/s; after the colon, how many
// requests the row sends.
func parseLoads(s string) ([]load, error) {
	var out []load
	for f := range strings.SplitSeq(s, ",") {
		spec, n, ok := strings.Cut(strings.TrimSpace(f), ":")
		reqs, err := strconv.Atoi(n)
		if !ok || err != nil || reqs < 1 || len(spec) < 2 {
			return nil, fmt.Errorf("load %q: want cN:REQUESTS or rN:REQUESTS", f)
		}
		v, err := strconv.ParseFloat(spec[1:], 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("load %q: bad number", f)
		}
		l := load{requests: reqs}
		switch spec[0] {
		case 'c':
			l.name, l.concurrency = fmt.Sprintf("concurrency %g", v), int(v)
		case 'r':
			// Enough clients that arrivals never wait for one.
			l.name, l.rate, l.concurrency = fmt.Sprintf("Poisson %g req/s", v), v, 1024
		default:
			return nil, fmt.Errorf("load %q: want c or r", f)
		}
		out = append(out, l)
	}
	return out, nil
}

// loadSummary is the part of loadgen's -json summary the table prints.
type loadSummary struct {
	Completed, Failed int
	RequestThroughput float64
	OutputThroughput  float64
	Goodput           float64
	GoodRequests      int
	OfferedRate       float64
	TTFT, TPOT        struct{ Values []time.Duration }
	FirstError        string
}

// servingConfig is what the serving mode needs beyond the checkpoint.
type servingConfig struct {
	server, loadgen, python string
	loads                   []load
	inputWords, maxTokens   int
	temperature             float64 // loadgen's -temperature (0: greedy)
	ttftSLO, tpotSLO        time.Duration
	ramp                    time.Duration // closed-loop loads: loadgen's -ramp
	rangeRatio              float64       // loadgen's -range-ratio (0: every request the same sizes)
	logDir                  string
	serverArgs              []string
}

func runServing(ctx context.Context, dir string, c servingConfig) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(c.logDir, "server.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append([]string{"-engine", "pyproc", "-python", c.python, "-model", dir, "-model-id", "bench", "-addr", addr}, c.serverArgs...)
	srv := exec.CommandContext(ctx, c.server, args...)
	srv.Stdout, srv.Stderr = logf, logf
	t0 := time.Now()
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() {
		_ = srv.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-done
		}
	}()
	base := "http://" + addr
	if err := waitReady(ctx, base, 10*time.Minute); err != nil {
		return fmt.Errorf("server not ready (see %s): %w", logf.Name(), err)
	}
	fmt.Printf("server ready in %v; %s\n", time.Since(t0).Round(time.Millisecond), grepLog(logf.Name(), "model loaded"))
	fmt.Printf("\nserving: examples/server -engine pyproc at the checkpoint's full context; cmd/loadgen %d-word prompts, %d output tokens (ignore_eos), range ratio %g, temperature %g, streamed; goodput SLO TTFT <= %v, TPOT <= %v\n",
		c.inputWords, c.maxTokens, c.rangeRatio, c.temperature, c.ttftSLO, c.tpotSLO)
	fmt.Println("| load | requests | failed | req/s | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | goodput req/s | met SLO | mean batch | mean step | between steps | prompt tokens cached | mean queue wait | GPU busy |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for i, l := range c.loads {
		before, err := scrape(ctx, base)
		if err != nil {
			return err
		}
		busy, clocks := sampleBusy(ctx), sampleClocks(ctx)
		logAt := fileSize(logf.Name())
		s, err := runLoad(ctx, c, base, l, uint64(i+1))
		busyPct, clocksSeen := busy(), clocks()
		if err != nil {
			return fmt.Errorf("%s: %w", l.name, err)
		}
		// The workers log a step-cycle summary when they go idle (a second
		// without steps, noticed at their next heartbeat): wait for it, so
		// this load's summaries are all in the log and the next load's
		// windows start afresh.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(workerIdle):
		}
		after, err := scrape(ctx, base)
		if err != nil {
			return err
		}
		batch := delta(before, after, "mlxserving_batch_size")
		wait := delta(before, after, "mlxserving_queue_wait_seconds")
		step := delta(before, after, "mlxserving_step_duration_seconds")
		between := delta(before, after, "mlxserving_step_between_seconds") // the batcher's own time a step (StepStats.Between)
		cached := growth(before, after, "mlxserving_prefix_cache_hits") / max(growth(before, after, "mlxserving_prefix_cache_queries"), 1)
		goodput := fmt.Sprintf("%.1f", s.Goodput)
		if s.OfferedRate > 0 {
			goodput += fmt.Sprintf(" (offered %.1f)", s.OfferedRate)
		}
		met := float64(s.GoodRequests) / float64(max(s.Completed+s.Failed, 1))
		fmt.Printf("| %s | %d | %d | %.1f | %.0f | %s | %s | %s | %s | %.0f%% | %.1f | %s | %s | %.0f%% | %s | %s |\n", l.name, s.Completed+s.Failed, s.Failed,
			s.RequestThroughput, s.OutputThroughput, ms(pct(s.TTFT.Values, 0)), ms(pct(s.TTFT.Values, 1)), ms(pct(s.TPOT.Values, 0)),
			goodput, 100*met, batch, ms(time.Duration(step*float64(time.Second))), ms(time.Duration(between*float64(time.Second))),
			100*cached, ms(time.Duration(wait*float64(time.Second))), busyPct)
		if s.FirstError != "" {
			fmt.Printf("  first error: %s\n", s.FirstError)
		}
		logged := logFrom(logf.Name(), logAt)
		if w := workerTiming(logged); w != "" {
			fmt.Printf("  workers, during this load: %s\n", w)
		}
		for _, tr := range workerTraces(logged) { // the server run with -trace-dir
			fmt.Printf("  a worker's device trace, during this load:\n    %s\n", strings.ReplaceAll(tr, "\n", "\n    "))
		}
		if clocksSeen != "-" {
			fmt.Printf("  GPU during this load: %s\n", clocksSeen)
		}
	}
	return nil
}

// workerIdle is how long after a load its workers' last step-cycle
// summaries are logged: their idle time (mlxsworker/timing.py's IDLE, 1 s)
// and a heartbeat (half a second in pyproc by default), with a margin.
const workerIdle = 2500 * time.Millisecond

var timingLine = regexp.MustCompile(`steps: (\d+) in ([\d.]+) s; a step ([\d.]+) ms in the worker \(([\d.]+) ms of it waiting for the device\), ([\d.]+) ms from its reply[^;\n"]*(; the device busy ([\d.]+) ms a step \((\d+) steps timed\), (\d+)% of the window)?`)

// logFrom is the server log at path past offset from, "" when it cannot
// be read.
func logFrom(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < from {
		return ""
	}
	return string(b[from:])
}

// workerTiming combines the step-cycle summaries the workers logged in
// logged, a part of the server log (mlxsworker/timing.py: time in the
// worker a step, waiting for the device, and from its reply to the next
// step's request, each weighted by its steps; where the worker timed them,
// the device's busy time a step, weighted by the steps timed, and its
// share of the windows, by their length), or "" when there are none.
func workerTiming(logged string) string {
	var steps, windows, timed int
	var secs, inside, wait, between, busy, share, timedSecs float64
	for _, m := range timingLine.FindAllStringSubmatch(logged, -1) {
		if m[6] != "" {
			ms, _ := strconv.ParseFloat(m[7], 64)
			k, _ := strconv.Atoi(m[8])
			pc, _ := strconv.ParseFloat(m[9], 64)
			w, _ := strconv.ParseFloat(m[2], 64)
			timed += k
			busy += float64(k) * ms
			share += w * pc
			timedSecs += w
		}
		n, _ := strconv.Atoi(m[1])
		f := make([]float64, 4)
		for i := range f {
			f[i], _ = strconv.ParseFloat(m[i+2], 64)
		}
		steps += n
		windows++
		secs += f[0]
		inside += float64(n) * f[1]
		wait += float64(n) * f[2]
		between += float64(n) * f[3]
	}
	if steps == 0 {
		return ""
	}
	n := float64(steps)
	out := fmt.Sprintf("steps: %d in %.1f s (%d summaries); a step %.2f ms in the worker (%.2f ms of it waiting for the device), "+
		"%.2f ms from its reply to the next step's request", steps, secs, windows, inside/n, wait/n, between/n)
	if timed > 0 {
		out += fmt.Sprintf("; the device busy %.2f ms a step (%d steps timed), %.0f%% of the windows", busy/float64(timed), timed,
			share/max(timedSecs, 1e-9))
	}
	return out
}

// traceLine is a worker's device-trace summary as the server logs it
// (mlxsworker/trace.py, its lines joined by " | " in a quoted msg).
var traceLine = regexp.MustCompile(`msg="INFO trace: (device trace (?:[^"\\]|\\.)*)"`)

// workerTraces returns the device-trace summaries the workers logged in
// logged, a part of the server log, one line of text per summary line.
func workerTraces(logged string) []string {
	var out []string
	for _, m := range traceLine.FindAllStringSubmatch(logged, -1) {
		text, err := strconv.Unquote(`"` + m[1] + `"`)
		if err != nil {
			text = m[1]
		}
		out = append(out, strings.ReplaceAll(text, " | ", "\n"))
	}
	return out
}

// fileSize is path's size, 0 when it cannot be read.
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// runLoad runs loadgen for one row with its own seed: every load sends
// prompts no earlier load sent, so no row is served from the prefix cache
// another warmed.
func runLoad(ctx context.Context, c servingConfig, base string, l load, seed uint64) (loadSummary, error) {
	args := []string{"-seed", strconv.FormatUint(seed, 10), "-url", base, "-model", "bench", "-json", "-percentiles", "50,99",
		"-requests", strconv.Itoa(l.requests), "-concurrency", strconv.Itoa(l.concurrency),
		"-input-words", strconv.Itoa(c.inputWords), "-max-tokens", strconv.Itoa(c.maxTokens),
		"-temperature", strconv.FormatFloat(c.temperature, 'f', -1, 64), "-range-ratio", strconv.FormatFloat(c.rangeRatio, 'f', -1, 64),
		"-duration", "10m", "-slo-ttft", c.ttftSLO.String(), "-slo-tpot", c.tpotSLO.String()}
	if l.rate > 0 {
		args = append(args, "-rate", strconv.FormatFloat(l.rate, 'f', -1, 64))
	} else if c.ramp > 0 {
		args = append(args, "-ramp", c.ramp.String())
	}
	cmd := exec.CommandContext(ctx, c.loadgen, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return loadSummary{}, fmt.Errorf("loadgen: %w", err)
	}
	var s loadSummary
	if err := json.Unmarshal(out, &s); err != nil {
		return loadSummary{}, fmt.Errorf("loadgen output: %w", err)
	}
	return s, nil
}

func pct(v []time.Duration, i int) time.Duration {
	if i < len(v) {
		return v[i]
	}
	return 0
}

func ms(d time.Duration) string {
	if d >= time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitReady(ctx context.Context, base string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/ready", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// metricSums maps a Prometheus histogram name to its _sum and _count,
// summed over label sets.
type metricSums map[string][2]float64

func scrape(ctx context.Context, base string) (metricSums, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseSums(resp.Body)
}

func parseSums(r io.Reader) (metricSums, error) {
	out := metricSums{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		idx := -1
		switch {
		case strings.HasSuffix(name, "_sum"):
			name, idx = strings.TrimSuffix(name, "_sum"), 0
		case strings.HasSuffix(name, "_count"):
			name, idx = strings.TrimSuffix(name, "_count"), 1
		case strings.HasSuffix(name, "_total"): // a counter: its value in [0]
			name, idx = strings.TrimSuffix(name, "_total"), 0
		default:
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		e := out[name]
		e[idx] += v
		out[name] = e
	}
	return out, sc.Err()
}

// delta is the mean of a histogram over what was observed between two
// scrapes; the name matches with or without a unit suffix.
func delta(before, after metricSums, name string) float64 {
	for k, a := range after {
		if k != name && !strings.HasPrefix(k, name+"_") {
			continue
		}
		b := before[k]
		if n := a[1] - b[1]; n > 0 {
			return (a[0] - b[0]) / n
		}
	}
	return 0
}

// growth is how much a counter grew between two scrapes; the name
// matches with or without a unit suffix.
func growth(before, after metricSums, name string) float64 {
	n := 0.0
	for k, a := range after {
		if k == name || strings.HasPrefix(k, name+"_") {
			n += a[0] - before[k][0]
		}
	}
	return n
}

func grepLog(path, substr string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var hits []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(line, substr) {
			hits = append(hits, strings.TrimSpace(line))
		}
	}
	if len(hits) == 0 {
		return "(no " + strconv.Quote(substr) + " in the server log)"
	}
	return strings.Join(hits[max(0, len(hits)-2):], "\n")
}

var errNoServer = errors.New("gpubench: -serving needs the -server and -loadgen binaries")
