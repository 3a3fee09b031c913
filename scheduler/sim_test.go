package scheduler_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/scheduler"
)

// The saturation simulation: requests of every tier arrive faster than a
// simulated continuous batcher (64 slots, 20 ms steps, one token per
// sequence per step) can serve them. The batcher pops at every step
// boundary while a slot is free, preempts lower tiers for a blocked
// critical request, and requeues what it preempted, which then recomputes.
// Time is virtual (WithClock), so a run is deterministic and fast.

const (
	simStep  = 20 * time.Millisecond
	simSlots = 64
)

// simMix is the share of arrivals per tier, in Tiers() order.
func simMix() []float64 { return []float64{0.05, 0.15, 0.40, 0.20, 0.20} }

type simSeq struct {
	remaining int  // steps left to run, prefill included
	started   bool // admitted at least once
}

type tierResult struct {
	arrived, rejected, completed int
	waits                        []time.Duration // push to first admission
}

func (r *tierResult) percentile(q float64) time.Duration {
	if len(r.waits) == 0 {
		return -1
	}
	w := slices.Clone(r.waits)
	slices.Sort(w)
	return w[min(len(w)-1, int(math.Ceil(q*float64(len(w))))-1)]
}

type sim struct {
	clk         *fakeClock
	s           *scheduler.PriorityScheduler[*simSeq]
	rng         *rand.Rand
	running     []*scheduler.Entry[*simSeq]
	tiers       map[api.Tier]*tierResult
	preemptions int
}

// simulate runs steps 20 ms steps with mean arrivals per step.
func simulate(tb testing.TB, steps int, arrivals float64, opts ...scheduler.Option) *sim {
	clk := newClock()
	s, err := scheduler.New[*simSeq](append([]scheduler.Option{scheduler.WithClock(clk.Now), scheduler.WithPreemption(true)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	m := &sim{clk: clk, s: s, rng: rand.New(rand.NewPCG(7, 11)), tiers: map[api.Tier]*tierResult{}}
	for _, t := range api.Tiers() {
		m.tiers[t] = &tierResult{}
	}
	for range steps {
		m.arrive(arrivals)
		m.admit()
		m.step()
	}
	return m
}

// arrive pushes one step's arrivals at random instants inside the step and
// leaves the clock at the step's end.
func (m *sim) arrive(mean float64) {
	offsets := make([]time.Duration, poisson(m.rng, mean))
	for i := range offsets {
		offsets[i] = time.Duration(m.rng.Int64N(int64(simStep)))
	}
	slices.Sort(offsets)
	at := time.Duration(0)
	for _, off := range offsets {
		m.clk.Advance(off - at)
		at = off
		tier := m.pickTier()
		prompt, maxNew := 16+m.rng.IntN(497), 16+m.rng.IntN(241)
		m.tiers[tier].arrived++
		e := &scheduler.Entry[*simSeq]{Value: &simSeq{remaining: 1 + maxNew}, Tier: tier, Cost: prompt + maxNew}
		if err := m.s.Push(e); err != nil {
			m.tiers[tier].rejected++
		}
	}
	m.clk.Advance(simStep - at)
}

// admit pops while a slot is free, preempting for blocked critical work.
func (m *sim) admit() {
	fits := func(*simSeq) bool { return len(m.running) < simSlots }
	for {
		next, blocked := m.s.Pop(fits)
		if next != nil {
			if !next.Value.started {
				next.Value.started = true
				m.tiers[next.Tier].waits = append(m.tiers[next.Tier].waits, m.clk.Now().Sub(next.Enqueued))
			}
			m.running = append(m.running, next)
			continue
		}
		if blocked == nil || !m.preemptFor(blocked) {
			return
		}
	}
}

// preemptFor evicts the lowest-tier running sequence blocked may preempt
// (the latest arrival among equals, as vLLM does) and requeues it.
func (m *sim) preemptFor(blocked *scheduler.Entry[*simSeq]) bool {
	victim := -1
	for i, e := range m.running {
		if !m.s.Preempts(blocked.Tier, e.Tier) {
			continue
		}
		if v := victim; v < 0 || m.running[v].Tier.Outranks(e.Tier) ||
			(m.running[v].Tier == e.Tier && e.Enqueued.After(m.running[v].Enqueued)) {
			victim = i
		}
	}
	if victim < 0 {
		return false
	}
	e := m.running[victim]
	m.running = slices.Delete(m.running, victim, victim+1)
	e.Value.remaining++ // recompute: one more prefill step
	m.s.Requeue(e)
	m.preemptions++
	return true
}

// step runs one engine step: every running sequence advances one token.
func (m *sim) step() {
	kept := m.running[:0]
	for _, e := range m.running {
		if e.Value.remaining--; e.Value.remaining > 0 {
			kept = append(kept, e)
		} else {
			m.tiers[e.Tier].completed++
		}
	}
	m.running = kept
}

func (m *sim) pickTier() api.Tier {
	x, tiers := m.rng.Float64(), api.Tiers()
	for i, share := range simMix() {
		if x < share {
			return tiers[i]
		}
		x -= share
	}
	return tiers[len(tiers)-1]
}

// poisson draws a Poisson-distributed count (Knuth; fine for small means).
func poisson(rng *rand.Rand, mean float64) int {
	limit, k, p := math.Exp(-mean), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= limit {
			return k
		}
		k++
	}
}

func (m *sim) report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s %8s %8s %9s %10s %10s\n", "tier", "arrived", "rejected", "completed", "wait p50", "wait p99")
	for _, t := range api.Tiers() {
		r := m.tiers[t]
		fmt.Fprintf(&b, "%-10s %8d %8d %9d %10s %10s\n", t, r.arrived, r.rejected, r.completed,
			r.percentile(0.5).Round(time.Millisecond), r.percentile(0.99).Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "preemptions %d", m.preemptions)
	return b.String()
}

// simSteps is ten simulated minutes; simArrivals is 1.3 times what the
// simulated batcher serves (64 slots / ~137 steps per request).
const (
	simSteps    = 30000
	simArrivals = 0.6
	simQueue    = 1000 // about 40 s of work at the simulated drain rate
)

// TestSaturation checks the promises under overload: critical p99 queue
// wait within its 100 ms SLA, and background work still completing.
func TestSaturation(t *testing.T) {
	m := simulate(t, simSteps/2, simArrivals, scheduler.WithMaxQueued(simQueue))
	t.Logf("saturation, %d steps of %s, %.2f arrivals per step:\n%s", simSteps/2, simStep, simArrivals, m.report())
	crit, bg := m.tiers[api.Critical], m.tiers[api.Background]
	if p99 := crit.percentile(0.99); p99 < 0 || p99 > scheduler.DefaultSLA(api.Critical) {
		t.Errorf("critical p99 queue wait %s, want within %s", p99, scheduler.DefaultSLA(api.Critical))
	}
	// High work cannot preempt, so its SLA is not a guarantee, but aged
	// work must yield to it once it nears its deadline: its p99 stays
	// close to the SLA instead of growing with the backlog of lower tiers.
	if p99, sla := m.tiers[api.High].percentile(0.99), scheduler.DefaultSLA(api.High); p99 > 2*sla {
		t.Errorf("high p99 queue wait %s, want within 2x its SLA of %s", p99, sla)
	}
	if bg.completed < bg.arrived/10 {
		t.Errorf("background completed %d of %d: starved", bg.completed, bg.arrived)
	}
	total := 0
	for _, r := range m.tiers {
		total += r.rejected
	}
	if total == 0 {
		t.Errorf("nothing was rejected: the simulation is not saturated")
	}
}

// TestSaturationWithoutAgingStarves shows the simulation can fail: with
// aging off, background work never runs under the same load.
func TestSaturationWithoutAgingStarves(t *testing.T) {
	m := simulate(t, simSteps/3, simArrivals, scheduler.WithMaxQueued(simQueue), scheduler.WithAging(0))
	if bg := m.tiers[api.Background]; bg.completed > bg.arrived/50 {
		t.Errorf("background completed %d of %d with aging off; the load does not saturate", bg.completed, bg.arrived)
	}
}

// BenchmarkSaturation reports per-tier queue-wait percentiles (ms of
// simulated time) and completions of the saturation simulation.
func BenchmarkSaturation(b *testing.B) {
	var m *sim
	for b.Loop() {
		m = simulate(b, simSteps, simArrivals, scheduler.WithMaxQueued(simQueue))
	}
	for _, t := range api.Tiers() {
		r := m.tiers[t]
		b.ReportMetric(float64(r.percentile(0.5))/1e6, t.String()+"-p50-ms")
		b.ReportMetric(float64(r.percentile(0.99))/1e6, t.String()+"-p99-ms")
		b.ReportMetric(float64(r.completed), t.String()+"-done")
	}
	b.Logf("\n%s", m.report())
}
