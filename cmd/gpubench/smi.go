package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// sampleSMI starts nvidia-smi printing fields every 100 ms over the GPUs
// the engine sees (CUDA_VISIBLE_DEVICES's, else every GPU of the
// machine) and hands each line's values to each, on one goroutine. It
// returns the function that stops it; ok is false without nvidia-smi.
func sampleSMI(ctx context.Context, fields string, each func(vals []string)) (stop func(), ok bool) {
	args := []string{"--query-gpu=" + fields, "--format=csv,noheader,nounits", "-lms", "100"}
	if ids := os.Getenv("CUDA_VISIBLE_DEVICES"); ids != "" {
		args = append(args, "-i", ids)
	}
	cmd := exec.CommandContext(ctx, "nvidia-smi", args...)
	out, err := cmd.StdoutPipe()
	if err != nil || cmd.Start() != nil {
		return func() {}, false
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			vals := strings.Split(sc.Text(), ",")
			for i := range vals {
				vals[i] = strings.TrimSpace(vals[i])
			}
			each(vals)
		}
	}()
	return func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
	}, true
}

// sampleBusy starts sampling nvidia-smi's utilization.gpu (the share of
// each 100 ms in which a kernel ran) — over CUDA_VISIBLE_DEVICES's GPUs
// where set, so an idle GPU beside a one-GPU server does not halve the
// figure — and returns the function that stops it and formats the mean
// ("-" without nvidia-smi).
func sampleBusy(ctx context.Context) func() string {
	var sum, n float64
	stop, ok := sampleSMI(ctx, "utilization.gpu", func(vals []string) {
		if v, err := strconv.ParseFloat(vals[0], 64); err == nil {
			sum, n = sum+v, n+1
		}
	})
	return func() string {
		stop()
		if !ok || n == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", sum/n)
	}
}

// clockFields are the fields sampleClocks reads, in clockStats.add's
// order.
const clockFields = "clocks.sm,clocks.mem,power.draw,clocks_throttle_reasons.active"

// clockStats sums nvidia-smi's clock samples: a run's mean SM and memory
// clocks and power, and every reason the driver gave for holding the
// clocks down. A GPU running slower than another of its kind shows here
// (two machines have differed by 40% on one binary).
type clockStats struct {
	sm, mem, watts float64
	n              int
	reasons        uint64
}

// add takes one sample: SM MHz, memory MHz, watts, the reasons' mask
// (hex). A line it cannot read is skipped.
func (c *clockStats) add(vals []string) {
	if len(vals) < 4 {
		return
	}
	sm, err1 := strconv.ParseFloat(vals[0], 64)
	mem, err2 := strconv.ParseFloat(vals[1], 64)
	watts, err3 := strconv.ParseFloat(vals[2], 64)
	mask, err4 := strconv.ParseUint(strings.TrimPrefix(vals[3], "0x"), 16, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return
	}
	c.sm, c.mem, c.watts, c.n = c.sm+sm, c.mem+mem, c.watts+watts, c.n+1
	c.reasons |= mask
}

// throttleReasons names the bits of nvidia-smi's clocks_throttle_reasons
// mask (NVML's clocks event reasons).
var throttleReasons = []struct {
	bit  uint64
	name string
}{
	{0x1, "idle"}, {0x2, "applications clocks"}, {0x4, "software power cap"}, {0x8, "hardware slowdown"},
	{0x10, "sync boost"}, {0x20, "software thermal"}, {0x40, "hardware thermal"}, {0x80, "hardware power brake"},
	{0x100, "display clocks"},
}

// String is "SM 1980 MHz, memory 3201 MHz, 512 W, held by: none" over the
// samples ("-" without any).
func (c *clockStats) String() string {
	if c.n == 0 {
		return "-"
	}
	var held []string
	for _, r := range throttleReasons {
		if c.reasons&r.bit != 0 {
			held = append(held, r.name)
		}
	}
	if rest := c.reasons &^ 0x1ff; rest != 0 {
		held = append(held, fmt.Sprintf("%#x", rest))
	}
	if len(held) == 0 {
		held = []string{"none"}
	}
	n := float64(c.n)
	return fmt.Sprintf("SM %.0f MHz, memory %.0f MHz, %.0f W, held by: %s", c.sm/n, c.mem/n, c.watts/n, strings.Join(held, ", "))
}

// sampleClocks starts sampling the GPU's clocks, power and throttle
// reasons and returns the function that stops it and formats them ("-"
// without nvidia-smi).
func sampleClocks(ctx context.Context) func() string {
	var c clockStats
	stop, _ := sampleSMI(ctx, clockFields, c.add)
	return func() string {
		stop()
		return c.String()
	}
}
