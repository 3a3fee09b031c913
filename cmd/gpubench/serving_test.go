package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseLoads(t *testing.T) {
	ls, err := parseLoads("c1:50, c64:512,r40:800")
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 || ls[0].concurrency != 1 || ls[0].requests != 50 || ls[1].concurrency != 64 ||
		ls[2].rate != 40 || ls[2].requests != 800 || ls[2].name != "Poisson 40 req/s" {
		t.Fatalf("parseLoads = %+v", ls)
	}
	for _, bad := range []string{"", "c1", "x4:10", "c0:10", "c4:0", "c4:x"} {
		if _, err := parseLoads(bad); err == nil {
			t.Errorf("parseLoads(%q) accepted", bad)
		}
	}
}

func TestHistogramDelta(t *testing.T) {
	before, err := parseSums(strings.NewReader(`# HELP mlxserving_batch_size Sequences per engine step.
mlxserving_batch_size_bucket{le="1"} 3
mlxserving_batch_size_sum{model="a"} 10
mlxserving_batch_size_count{model="a"} 5
mlxserving_queue_wait_seconds_sum 1.5
mlxserving_queue_wait_seconds_count 3
`))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseSums(strings.NewReader(`mlxserving_batch_size_sum{model="a"} 110
mlxserving_batch_size_count{model="a"} 7
mlxserving_batch_size_sum{model="b"} 40
mlxserving_batch_size_count{model="b"} 3
mlxserving_queue_wait_seconds_sum 1.5
mlxserving_queue_wait_seconds_count 3
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := delta(before, after, "mlxserving_batch_size"); got != 28 { // (150-10)/(10-5)
		t.Errorf("mean batch = %v, want 28", got)
	}
	if got := delta(before, after, "mlxserving_queue_wait_seconds"); got != 0 {
		t.Errorf("queue wait with nothing observed = %v, want 0", got)
	}
}

func TestBandwidthFor(t *testing.T) {
	for _, c := range []struct {
		info string
		flag float64
		want float64
	}{
		{"NVIDIA H200 cuda 13.0 torch 2.11", 0, 4.8e12},
		{"NVIDIA H100 80GB HBM3", 0, 3.35e12},
		{"NVIDIA H100 PCIe", 0, 2.0e12},
		{"NVIDIA H200", 2e12, 2e12},
		{"Some Future GPU", 0, fallbackBandwidth},
	} {
		if got, _ := bandwidthFor(c.info, c.flag); got != c.want {
			t.Errorf("bandwidthFor(%q, %v) = %v, want %v", c.info, c.flag, got, c.want)
		}
	}
}

// TestWorkerTiming combines the step-cycle summaries logged past an
// offset of a server log, each weighted by its steps.
func TestWorkerTiming(t *testing.T) {
	log := filepath.Join(t.TempDir(), "server.log")
	before := `time=1 level=INFO msg="model loaded" model=bench
time=2 level=INFO msg="INFO timing: steps: 1 in 14.0 s; a step 98.00 ms in the worker (0.00 ms of it waiting for the device), 0.00 ms from its reply to the next step's request" worker=0
`
	during := `time=3 level=INFO msg="INFO timing: steps: 10 in 1.0 s; a step 1.00 ms in the worker (0.50 ms of it waiting for the device), 0.20 ms from its reply to the next step's request" worker=0
time=4 level=INFO msg="INFO timing: steps: 30 in 3.0 s; a step 2.00 ms in the worker (0.50 ms of it waiting for the device), 0.40 ms from its reply to the next step's request" worker=0
`
	timedLines := `time=5 level=INFO msg="INFO timing: steps: 10 in 1.0 s; a step 1.00 ms in the worker (0.50 ms of it waiting for the device), 0.20 ms from its reply to the next step's request; the device busy 0.80 ms a step (10 steps timed), 80% of the window" worker=0
time=6 level=INFO msg="INFO timing: steps: 30 in 3.0 s; a step 2.00 ms in the worker (0.50 ms of it waiting for the device), 0.40 ms from its reply to the next step's request; the device busy 1.60 ms a step (30 steps timed), 60% of the window" worker=0
`
	if err := os.WriteFile(log, []byte(before+during), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "steps: 40 in 4.0 s (2 summaries); a step 1.75 ms in the worker (0.50 ms of it waiting for the device), 0.35 ms from its reply to the next step's request"
	if got := workerTiming(logFrom(log, int64(len(before)))); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := workerTiming(logFrom(log, int64(len(before)+len(during)))); got != "" {
		t.Errorf("nothing past the offset: %q", got)
	}
	// The device's busy time where the worker timed it (CUDA).
	if err := os.WriteFile(log, []byte(timedLines), 0o644); err != nil {
		t.Fatal(err)
	}
	want += "; the device busy 1.40 ms a step (40 steps timed), 65% of the windows"
	if got := workerTiming(logFrom(log, 0)); got != want {
		t.Errorf("timed: got %q, want %q", got, want)
	}
	if got := workerTiming(logFrom(filepath.Join(t.TempDir(), "missing"), 0)); got != "" {
		t.Errorf("missing log: %q", got)
	}
}

// TestWorkerTraces finds the device-trace summaries a worker logged past
// an offset of a server log, their lines split again.
func TestWorkerTraces(t *testing.T) {
	log := filepath.Join(t.TempDir(), "server.log")
	before := `time=1 level=INFO msg="INFO trace: device trace trace-1-1.json.gz: 5 steps over 9.0 ms | no device events (a CPU worker); the window: stepped (host work) 90.0%" worker=0
`
	during := `time=2 level=INFO msg="INFO timing: steps: 10 in 1.0 s" worker=0
time=3 level=INFO msg="INFO trace: device trace trace-1-2.json.gz: 250 steps over 3000.0 ms | the device busy 2700.0 ms, 90.0% of the window | a gap of 1.000 ms at +3.0 ms, the worker stepped (host work); after 'k \"a\"', before nothing" worker=0
time=4 level=INFO msg="INFO trace: trace: stopped in 0.50 s, exported in 0.10 s, written in 0.20 s" worker=0
`
	if err := os.WriteFile(log, []byte(before+during), 0o644); err != nil {
		t.Fatal(err)
	}
	got := workerTraces(logFrom(log, int64(len(before))))
	want := "device trace trace-1-2.json.gz: 250 steps over 3000.0 ms\nthe device busy 2700.0 ms, 90.0% of the window\n" +
		`a gap of 1.000 ms at +3.0 ms, the worker stepped (host work); after 'k "a"', before nothing`
	if len(got) != 1 || got[0] != want {
		t.Errorf("got %q, want [%q]", got, want)
	}
	if got := workerTraces(logFrom(log, 0)); len(got) != 2 {
		t.Errorf("from the start: %d summaries, want 2", len(got))
	}
	if got := workerTraces(logFrom(filepath.Join(t.TempDir(), "missing"), 0)); got != nil {
		t.Errorf("missing log: %q", got)
	}
}
