package scheduler

import "time"

// Effective priority.
//
// An entry's effective tier starts at its own tier and rises by one every
// aging interval, up to High. Inside each effective tier there are two
// bands: the promoted band first (entries close to their deadline, and
// entries that aged past High), ordered by the time they were promoted —
// earliest deadline first for one tier — and then the ordinary band,
// shortest job first. So the order of bands, most urgent first, is
// critical promoted, critical, high promoted, high, normal promoted, ...
//
// Every change of band happens at a time fixed when the entry is queued
// (its enqueue time plus multiples of the aging interval, or its deadline
// minus the promotion margin), so the scheduler keeps one heap of entries
// keyed by their next change and moves the due ones when Pop looks: each
// entry moves at most a handful of times, O(log n) each.

// numBands is two bands (ordinary, promoted) per tier.
const numBands = 2 * numTiers

// band returns the band index of an effective tier rank; a higher index
// runs first.
func band(rank int, promoted bool) int {
	if promoted {
		return 2*rank + 1
	}
	return 2 * rank
}

// placement is where an entry belongs at one moment.
type placement struct {
	band       int
	promotedAt time.Time // zero when not promoted
	next       time.Time // the next change of band; zero for none
}

// place computes e's band at now from its enqueue time, its tier's SLA
// and the aging interval. It reads only e's bookkeeping set by Push.
func (s *PriorityScheduler[T]) place(e *Entry[T], now time.Time) placement {
	b := int(e.rank)
	lvl := b
	var promotedAt, next time.Time
	earliest := func(t time.Time) {
		if promotedAt.IsZero() || t.Before(promotedAt) {
			promotedAt = t
		}
	}
	upcoming := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if at := s.promotionTime(e); !at.IsZero() {
		if now.Before(at) {
			upcoming(at)
		} else {
			earliest(at)
		}
	}
	if a := s.cfg.aging; a > 0 && b <= rankHigh {
		steps := int64(0)
		if w := now.Sub(e.Enqueued); w > 0 {
			steps = int64(w / a)
		}
		toPromoted := int64(rankHigh - b + 1) // steps that age it past High
		if steps >= toPromoted {
			lvl = rankHigh
			earliest(e.Enqueued.Add(time.Duration(toPromoted) * a))
		} else {
			lvl = b + int(steps)
			upcoming(e.Enqueued.Add(time.Duration(steps+1) * a))
		}
	}
	if !promotedAt.IsZero() && lvl == rankHigh {
		// Promoted in the highest tier aging reaches: nothing later can
		// move it (a later promotion time never replaces an earlier one).
		next = time.Time{}
	}
	return placement{band: band(lvl, !promotedAt.IsZero()), promotedAt: promotedAt, next: next}
}

// promotionTime is when e moves ahead of its tier because its deadline is
// near, or zero when its tier has no SLA or promotion is off.
func (s *PriorityScheduler[T]) promotionTime(e *Entry[T]) time.Time {
	sla := s.cfg.sla[e.rank]
	if sla <= 0 || s.cfg.promotion <= 0 || e.Deadline.IsZero() {
		return time.Time{}
	}
	return e.Deadline.Add(-time.Duration(float64(sla) * s.cfg.promotion))
}

// insert places e at now and adds it to its band and, when it will move
// again, to the heap of pending moves. Has to be called with the lock.
func (s *PriorityScheduler[T]) insert(e *Entry[T], now time.Time) {
	p := s.place(e, now)
	e.band, e.promotedAt, e.next = int8(p.band), p.promotedAt, p.next
	s.bands[p.band].push(e)
	if !p.next.IsZero() {
		s.moves.push(e)
	}
}

// detach takes e out of every heap. Has to be called with the lock.
func (s *PriorityScheduler[T]) detach(e *Entry[T]) {
	s.bands[e.band].remove(e)
	if e.movePos >= 0 {
		s.moves.remove(e)
	}
}

// advance moves every entry whose band changes by now. Has to be called
// with the lock.
func (s *PriorityScheduler[T]) advance(now time.Time) {
	for {
		e := s.moves.top()
		if e == nil || e.next.After(now) {
			return
		}
		s.detach(e)
		s.insert(e, now)
	}
}

// top returns the most urgent queued entry. Has to be called with the
// lock, after advance.
func (s *PriorityScheduler[T]) top() *Entry[T] {
	for b := numBands - 1; b >= 0; b-- {
		if e := s.bands[b].top(); e != nil {
			return e
		}
	}
	return nil
}

// newBands builds the band heaps: promoted bands order by promotion time,
// ordinary bands by cost; ties go to the earlier entry.
func newBands[T any]() [numBands]entryHeap[T] {
	var bands [numBands]entryHeap[T]
	pos := func(e *Entry[T]) *int { return &e.bandPos }
	for b := range bands {
		bands[b] = entryHeap[T]{pos: pos, less: lessByCost[T]}
		if b%2 == 1 {
			bands[b].less = lessByPromotion[T]
		}
	}
	return bands
}

func lessByCost[T any](a, b *Entry[T]) bool {
	if a.cost != b.cost {
		return a.cost < b.cost
	}
	return earlier(a, b)
}

func lessByPromotion[T any](a, b *Entry[T]) bool {
	if !a.promotedAt.Equal(b.promotedAt) {
		return a.promotedAt.Before(b.promotedAt)
	}
	return earlier(a, b)
}

func lessByNext[T any](a, b *Entry[T]) bool {
	if !a.next.Equal(b.next) {
		return a.next.Before(b.next)
	}
	return a.seq < b.seq
}

func earlier[T any](a, b *Entry[T]) bool {
	if !a.Enqueued.Equal(b.Enqueued) {
		return a.Enqueued.Before(b.Enqueued)
	}
	return a.seq < b.seq
}
