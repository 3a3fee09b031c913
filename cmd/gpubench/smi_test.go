package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestClockStats(t *testing.T) {
	var c clockStats
	if got := c.String(); got != "-" {
		t.Fatalf("no samples: %q, want -", got)
	}
	for _, line := range [][]string{
		{"1980", "3201", "500.5", "0x0000000000000000"},
		{"1700", "3201", "699.5", "0x0000000000000004"},
		{"[N/A]", "3201", "1", "0x0"}, // unreadable: skipped
		{"1980", "3201"},              // short: skipped
		{"1900", "3201", "600", "0x0000000000001040"},
	} {
		c.add(line)
	}
	want := "SM 1860 MHz, memory 3201 MHz, 600 W, held by: software power cap, hardware thermal, 0x1000"
	if got := c.String(); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	var idle clockStats
	idle.add([]string{"1980", "2619", "120", "0x0"})
	if got := idle.String(); got != "SM 1980 MHz, memory 2619 MHz, 120 W, held by: none" {
		t.Fatalf("unthrottled: %q", got)
	}
}

// Without nvidia-smi on the PATH (CI) the samplers report "-" and stop.
func TestSamplersWithoutNvidiaSMI(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if got := sampleClocks(context.Background())(); got != "-" {
		t.Fatalf("clocks: %q, want -", got)
	}
	if got := sampleBusy(context.Background())(); got != "-" {
		t.Fatalf("busy: %q, want -", got)
	}
}

// The samplers read what nvidia-smi prints, over the GPUs
// CUDA_VISIBLE_DEVICES names: here a stand-in nvidia-smi (CI has no GPU)
// that prints two samples, records its arguments and exits.
func TestSamplersRead(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho \"$@\" >> " + filepath.Join(dir, "args") + "\n" +
		"case \"$*\" in *utilization*) echo 80; echo 100;; " +
		"*) echo '1980, 3201, 500, 0x0000000000000000'; echo '1780, 3201, 600, 0x0000000000000004';; esac\n" +
		": > " + filepath.Join(dir, "done") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	t.Setenv("CUDA_VISIBLE_DEVICES", "1")
	// Each sampler stops once the stand-in has printed everything, as a
	// benchmark stops nvidia-smi after its run.
	finished := func(start func(context.Context) func() string) string {
		_ = os.Remove(filepath.Join(dir, "done"))
		stop := start(context.Background())
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
				break
			}
		}
		return stop()
	}
	if got, want := finished(sampleClocks), "SM 1880 MHz, memory 3201 MHz, 550 W, held by: software power cap"; got != want {
		t.Fatalf("clocks: %q, want %q", got, want)
	}
	if got := finished(sampleBusy); got != "90.0%" {
		t.Fatalf("busy: %q, want 90.0%%", got)
	}
	args, err := os.ReadFile(filepath.Join(dir, "args"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(args)), "\n") {
		if !strings.Contains(line, "-i 1") || !strings.Contains(line, "--format=csv,noheader,nounits") {
			t.Fatalf("nvidia-smi ran with %q", line)
		}
	}
}
