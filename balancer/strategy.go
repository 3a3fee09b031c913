package balancer

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/internal/mix"
)

// Route is what a routing strategy knows of a request.
type Route struct {
	// Model is the requested model.
	Model string
	// Session is the affinity key: the request's session id or routing
	// key; "" when it has none.
	Session string
	// Prefix is the prompt's text (a chat's messages joined), which
	// prefix-aware routing matches against what each backend has seen.
	Prefix string
}

// Candidate is one backend a strategy may choose, with the signals it
// weighs. Every candidate serves the request's model, is healthy and is not
// draining.
type Candidate struct {
	// Name is the backend's name in the balancer.
	Name string
	// Load is the backend's load report as of the balancer's routing
	// snapshot (at most one refresh interval old).
	Load Load
	// InFlight is how many requests this balancer has open on the backend.
	InFlight int
	// Latency is the backend's peak-EWMA time to first token; zero before
	// any was observed.
	Latency time.Duration
	// PrefixMatch is the fraction of the request's prefix the balancer
	// expects the backend to hold in its prefix cache, 0 to 1.
	PrefixMatch float64
}

// Pending is the candidate's outstanding work as the balancer sees it:
// its own requests in flight or the backend's reported queue and running
// sequences, whichever is larger (the report lags; the count does not,
// but other balancers' requests show only in the report).
func (c Candidate) Pending() int {
	return max(c.InFlight, c.Load.Waiting+c.Load.Running)
}

// Strategy picks a backend for a request. Pick is called with at least one
// candidate and returns an index into cands. Strategies must be safe for
// concurrent use.
type Strategy interface {
	Pick(r Route, cands []Candidate) int
}

// StrategyFunc adapts a function to Strategy.
type StrategyFunc func(r Route, cands []Candidate) int

// Pick calls f.
func (f StrategyFunc) Pick(r Route, cands []Candidate) int { return f(r, cands) }

// RoundRobin sends requests to the candidates in turn.
func RoundRobin() Strategy {
	var next atomic.Uint64
	return StrategyFunc(func(_ Route, cands []Candidate) int {
		return int((next.Add(1) - 1) % uint64(len(cands)))
	})
}

// LeastLoaded sends a request to the candidate with the least pending work
// (requests in flight, queued and running), breaking ties by KV use.
func LeastLoaded() Strategy {
	return StrategyFunc(func(_ Route, cands []Candidate) int {
		best := 0
		for i := 1; i < len(cands); i++ {
			a, b := cands[i], cands[best]
			if a.Pending() < b.Pending() || (a.Pending() == b.Pending() && a.Load.KVUsage < b.Load.KVUsage) {
				best = i
			}
		}
		return best
	})
}

// PeakEWMA sends a request to the candidate with the lowest expected
// latency: its peak-EWMA time to first token scaled by its pending work
// plus one (Finagle's and Envoy's peak EWMA). Candidates with no latency
// observed yet are tried first.
func PeakEWMA() Strategy {
	return StrategyFunc(func(_ Route, cands []Candidate) int {
		best, bestCost := 0, math.Inf(1)
		for i, c := range cands {
			cost := float64(c.Latency) * float64(c.Pending()+1)
			if cost < bestCost {
				best, bestCost = i, cost
			}
		}
		return best
	})
}

// PowerOfTwo picks two candidates at random and sends the request to the
// one the inner strategy prefers (LeastLoaded when inner is nil): most of
// the benefit of a full scan, without every balancer herding onto the
// same least-loaded backend.
func PowerOfTwo(inner Strategy) Strategy {
	if inner == nil {
		inner = LeastLoaded()
	}
	return StrategyFunc(func(r Route, cands []Candidate) int {
		if len(cands) <= 2 {
			return inner.Pick(r, cands)
		}
		i := rand.IntN(len(cands))
		j := rand.IntN(len(cands) - 1)
		if j >= i {
			j++
		}
		if inner.Pick(r, []Candidate{cands[i], cands[j]}) == 0 {
			return i
		}
		return j
	})
}

// SessionAffinity keeps a session on one backend by consistent hashing
// (rendezvous hashing of the session key over the candidates) with
// bounded load: a backend whose pending work exceeds loadFactor times the
// average (plus one) is skipped for the next in the session's order, so a
// hot session cannot overload its home. Requests without a session go to
// fallback (LeastLoaded when nil). loadFactor ≤ 1 means 1.25.
func SessionAffinity(loadFactor float64, fallback Strategy) Strategy {
	if loadFactor <= 1 {
		loadFactor = 1.25
	}
	if fallback == nil {
		fallback = LeastLoaded()
	}
	return StrategyFunc(func(r Route, cands []Candidate) int {
		if r.Session == "" {
			return fallback.Pick(r, cands)
		}
		total := 0
		for _, c := range cands {
			total += c.Pending()
		}
		bound := loadFactor*float64(total)/float64(len(cands)) + 1
		best, bestScore := -1, uint64(0)
		for i, c := range cands {
			if float64(c.Pending()) > bound {
				continue
			}
			if s := rendezvous(r.Session, c.Name); best < 0 || s > bestScore {
				best, bestScore = i, s
			}
		}
		if best < 0 {
			return fallback.Pick(r, cands)
		}
		return best
	})
}

// rendezvous is the highest-random-weight score of key on backend. It is
// a fixed function (FNV-1a, then [mix.Mix64]), so every balancer
// replica, in every process, sends a session to the same home.
func rendezvous(key, backend string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(backend))
	return mix.Mix64(h.Sum64())
}

// PrefixAware sends a request to the candidate expected to hold the
// longest prefix of its prompt (SGLang's cache-aware policy) when the
// best match covers at least minMatch of the prompt and the backends are
// balanced; when the busiest and idlest candidates differ by more than
// absImbalance requests and by more than relImbalance times, or no match
// is good enough, it falls back to LeastLoaded. Zero values take SGLang's
// defaults: 0.3, 64, 1.5.
func PrefixAware(minMatch float64, absImbalance int, relImbalance float64) Strategy {
	if minMatch <= 0 {
		minMatch = 0.3
	}
	if absImbalance <= 0 {
		absImbalance = 64
	}
	if relImbalance <= 0 {
		relImbalance = 1.5
	}
	least := LeastLoaded()
	return StrategyFunc(func(r Route, cands []Candidate) int {
		lo, hi := math.MaxInt, 0
		for _, c := range cands {
			lo, hi = min(lo, c.Pending()), max(hi, c.Pending())
		}
		if hi-lo > absImbalance && float64(hi) > relImbalance*float64(lo) {
			return least.Pick(r, cands)
		}
		best := -1
		for i, c := range cands {
			if c.PrefixMatch >= minMatch && (best < 0 || c.PrefixMatch > cands[best].PrefixMatch ||
				(c.PrefixMatch == cands[best].PrefixMatch && c.Pending() < cands[best].Pending())) {
				best = i
			}
		}
		if best < 0 {
			return least.Pick(r, cands)
		}
		return best
	})
}

// Weights are the weights of Weighted's scorers; a zero weight turns a
// signal off.
type Weights struct {
	// Queue scores low pending work (1 for the least loaded, 0 for the
	// most).
	Queue float64
	// KV scores free KV cache (1 - KVUsage).
	KV float64
	// Prefix scores the expected prefix-cache match.
	Prefix float64
	// Session scores the session's home backend (its rendezvous winner).
	Session float64
	// Latency scores low peak-EWMA latency.
	Latency float64
}

// DefaultWeights are llm-d's default scorer weights: queue 2, KV use 2,
// prefix 3; session affinity 1 and latency 0 on top.
var DefaultWeights = Weights{Queue: 2, KV: 2, Prefix: 3, Session: 1}

// Weighted scores every candidate on several normalised signals and sends
// the request to the highest total (llm-d's endpoint picker).
func Weighted(w Weights) Strategy {
	return StrategyFunc(func(r Route, cands []Candidate) int {
		maxPending, maxLat := 0, time.Duration(0)
		home, homeScore := -1, uint64(0)
		for i, c := range cands {
			maxPending = max(maxPending, c.Pending())
			maxLat = max(maxLat, c.Latency)
			if r.Session != "" {
				if s := rendezvous(r.Session, c.Name); home < 0 || s > homeScore {
					home, homeScore = i, s
				}
			}
		}
		best, bestScore := 0, math.Inf(-1)
		for i, c := range cands {
			score := w.KV*(1-c.Load.KVUsage) + w.Prefix*c.PrefixMatch
			if maxPending > 0 {
				score += w.Queue * (1 - float64(c.Pending())/float64(maxPending))
			} else {
				score += w.Queue
			}
			if maxLat > 0 {
				score += w.Latency * (1 - float64(c.Latency)/float64(maxLat))
			}
			if i == home {
				score += w.Session
			}
			if score > bestScore {
				best, bestScore = i, score
			}
		}
		return best
	})
}
