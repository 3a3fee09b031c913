package balancer

import (
	"time"

	"github.com/mlxserving/mlxserving/retry"
)

// BackendStats is one backend's state in the balancer.
type BackendStats struct {
	Name     string
	Healthy  bool
	Draining bool
	Breaker  retry.Status
	InFlight int
	Routed   uint64
	// Failovers and Resumes count the requests that left this backend
	// for another: before their first token, and after tokens.
	Failovers, Resumes uint64
	// Latency is the peak-EWMA time to first token.
	Latency time.Duration
	Load    Load
}

// Stats is a snapshot of a balancer.
type Stats struct {
	Backends []BackendStats
	// Routed counts requests placed on a backend (a failover counts
	// again); Failovers those moved to another backend before their first
	// token; Refused requests no backend could take; Interrupted streams a
	// backend broke after tokens were sent; Resumed streams that went on
	// on another backend after tokens were sent (a stream resumed twice
	// counts twice).
	Routed, Failovers, Refused, Interrupted, Resumed uint64
	// AffinityHome, AffinitySpilled and AffinityMoved count the requests
	// of sessions with a home (see AffinityBounds): sent home, sent
	// elsewhere once with the home kept, and moving the home.
	AffinityHome, AffinitySpilled, AffinityMoved uint64
}

// Stats returns a snapshot, backends sorted by name; their Load is the
// report routing uses now.
func (lb *LoadBalancer) Stats() Stats {
	out := Stats{
		Routed: lb.stats.routed.Load(), Failovers: lb.stats.failovers.Load(),
		Refused: lb.stats.refused.Load(), Interrupted: lb.stats.interrupted.Load(), Resumed: lb.stats.resumed.Load(),
		AffinityHome: lb.stats.home.Load(), AffinitySpilled: lb.stats.spilled.Load(), AffinityMoved: lb.stats.moved.Load(),
	}
	for _, v := range lb.snap.Load().members { // sorted by name
		m := v.m
		out.Backends = append(out.Backends, BackendStats{
			Name: m.name, Healthy: m.healthy.Load(), Draining: m.draining.Load(),
			Breaker: m.breaker.Status(), InFlight: int(m.inflight.Load()), Routed: m.routed.Load(),
			Failovers: m.failovers.Load(), Resumes: m.resumes.Load(),
			Latency: m.latency(), Load: v.load,
		})
	}
	return out
}
