//go:build mlx

package mlx

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/metal"
)

func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// TestNoLeaks runs thousands of requests (greedy and sampled, with
// logprobs and penalties, prefilled in chunks) and checks that MLX's active memory returns to its baseline,
// and that engines started and closed leave no threads behind.
func TestNoLeaks(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 200
	}
	e := newEngine(t, WithPrefixSlots(4))
	m := load(t, e, tinyDir(t, nil))
	sampled := &engine.SamplingParams{Temperature: 0.8, TopP: 0.9, RepetitionPenalty: 1.1, Logprobs: true}
	run := func(count int) {
		for i := 0; i < count; i++ {
			p := prompts()[i%4]
			var params *engine.SamplingParams
			if i%2 == 1 {
				params = sampled
			}
			generate(t, m, engine.SeqID(i), p, 3, 4, params)
		}
	}
	run(8)
	baseThreads := threads(t)
	base, err := metal.ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	run(n)
	after, err := metal.ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests: active memory %d -> %d bytes (peak %d)", n, base.Active, after.Active, after.Peak)
	if after.Active != base.Active {
		t.Fatalf("active memory %d after %d requests, baseline %d", after.Active, n, base.Active)
	}
	// The Go runtime may add a few threads under load; a leak would add
	// one or more per request.
	const slack = 4
	if now := threads(t); now > baseThreads+slack {
		t.Fatalf("threads %d -> %d over %d requests", baseThreads, now, n)
	}
	// MLX gives every thread that uses it its own default stream, with a
	// worker thread MLX keeps until the process exits: each Engine costs
	// one such thread for good (see New). Nothing else may stay behind.
	const cycles = 5
	before := threads(t)
	for i := 0; i < cycles; i++ {
		e2, err := New()
		if err != nil {
			t.Fatal(err)
		}
		load(t, e2, tinyDir(t, nil))
		e2.Close()
	}
	if now := threads(t); now > before+cycles+slack {
		t.Fatalf("threads %d -> %d after %d engines started and closed", before, now, cycles)
	}
}
