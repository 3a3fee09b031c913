package balancer

import (
	"context"
	"fmt"
	"time"
)

// AffinityStore keeps session → backend assignments where several
// balancer replicas can share them (balancer/redisaffinity keeps them in
// Redis), so every replica routes a session to the instance that holds
// its KV cache. Errors mean the store is unreachable: the balancer then
// decides locally and logs a warning.
type AffinityStore interface {
	// Get returns the backend assigned to key, or "" when none is.
	Get(ctx context.Context, key string) (backend string, err error)
	// Set assigns key to backend for ttl, refreshing the entry.
	Set(ctx context.Context, key, backend string, ttl time.Duration) error
}

// Registry is what discovery (balancer/natsbackend) needs of a balancer:
// backends come and go as instances announce themselves and stop.
type Registry interface {
	// Add starts routing to b under name; a second Add of the same name
	// replaces the backend.
	Add(name string, b Backend) error
	// Remove stops routing new requests to name; requests in flight
	// finish.
	Remove(name string)
}

// AffinityBounds say when a session's request leaves its home backend (the
// one the affinity store names, which holds the session's KV cache). A
// home briefly busier than the rest keeps its sessions: a request spills
// to another backend for once without changing the home, and the home
// moves only when it stays overloaded. The zero value of a field takes its
// default, as gobreaker's Settings do.
type AffinityBounds struct {
	// SpillPending and SpillFactor: when the home holds more than
	// SpillPending pending requests and more than SpillFactor times the
	// mean over the backends that could take the request, the request
	// goes to the backend the strategy picks; the home stays. Defaults 8
	// and 1.5.
	SpillPending int
	SpillFactor  float64
	// MovePending, MoveFactor and MoveAfter: when the home has held more
	// than MovePending pending and more than MoveFactor times the mean
	// for MoveAfter without a break, the session moves: the backend its
	// request goes to becomes its home. Defaults 16, 2 and 5 s.
	MovePending int
	MoveFactor  float64
	MoveAfter   time.Duration
}

// DefaultAffinityBounds are the bounds a balancer uses unless
// WithAffinityBounds says otherwise.
var DefaultAffinityBounds = AffinityBounds{SpillPending: 8, SpillFactor: 1.5, MovePending: 16, MoveFactor: 2, MoveAfter: 5 * time.Second}

// withDefaults fills zero fields from DefaultAffinityBounds.
func (b AffinityBounds) withDefaults() AffinityBounds {
	d := DefaultAffinityBounds
	if b.SpillPending == 0 {
		b.SpillPending = d.SpillPending
	}
	if b.SpillFactor == 0 {
		b.SpillFactor = d.SpillFactor
	}
	if b.MovePending == 0 {
		b.MovePending = d.MovePending
	}
	if b.MoveFactor == 0 {
		b.MoveFactor = d.MoveFactor
	}
	if b.MoveAfter == 0 {
		b.MoveAfter = d.MoveAfter
	}
	return b
}

// check refuses bounds that cannot hold.
func (b AffinityBounds) check() error {
	switch {
	case b.SpillPending < 0 || b.MovePending < 0 || b.MoveAfter < 0:
		return fmt.Errorf("affinity bounds %+v: negative", b)
	case b.SpillFactor < 1 || b.MoveFactor < 1:
		return fmt.Errorf("affinity bounds %+v: a factor below 1 would leave a home no busier than the mean", b)
	case b.MovePending < b.SpillPending || b.MoveFactor < b.SpillFactor:
		return fmt.Errorf("affinity bounds %+v: the move bound is below the spill bound", b)
	}
	return nil
}

// homeDecision is what the affinity store's home means for one request.
type homeDecision int

const (
	noHome  homeDecision = iota // no session, no store, or the store is unreachable
	atHome                      // the request goes home
	newHome                     // no home among the candidates: the strategy picks one, which becomes the home
	spilled                     // the home is busy: elsewhere this once, the home stays
	moved                       // the home stayed overloaded: the strategy picks the new home
)

// judgeHome applies the bounds to the home's pending requests against
// the mean over the candidates, at now. over is when the home last began
// to exceed the move bound (0: it does not), updated here.
func (b AffinityBounds) judgeHome(pending int, mean float64, over *int64, now time.Time) homeDecision {
	p := float64(pending)
	if pending > b.MovePending && p > b.MoveFactor*mean {
		if *over == 0 {
			*over = now.UnixNano()
		} else if now.Sub(time.Unix(0, *over)) >= b.MoveAfter {
			*over = 0
			return moved
		}
	} else {
		*over = 0
	}
	if pending > b.SpillPending && p > b.SpillFactor*mean {
		return spilled
	}
	return atHome
}
