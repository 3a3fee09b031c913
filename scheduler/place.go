package scheduler

import (
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// Effective priority.
//
// An entry's effective tier starts at its own tier and rises by one every
// aging interval, up to High; an entry aged into a tier counts as an
// arrival of that tier at the moment it got there. An entry is promoted
// when less than the promotion fraction of its effective tier's SLA is
// left (at High, an aged entry or one of a tier without SLA is promoted
// one aging interval after it got there, so aging alone moves it on).
//
// Each effective tier has three bands, run in this order:
//
//   - promoted entries of the tier itself, earliest promotion (deadline)
//     first: work of this tier about to miss its SLA;
//   - promoted entries aged into the tier, earliest promotion first: old
//     work of lower tiers, which therefore runs before fresh work of this
//     tier but never pushes this tier's own work past its deadline;
//   - the rest, shortest job first.
//
// So aged work starves only when a tier above it cannot meet its own SLAs
// by itself, and critical work is never displaced by aging at all.
//
// Every change of band happens at a time fixed when the entry is queued
// (its enqueue time plus multiples of the aging interval, plus the
// promotion point of the tier it is in), so the scheduler keeps one heap
// of entries keyed by their next change and moves the due ones when Pop
// looks: each entry moves at most twice per tier, O(log n) each.

// Kinds of band inside one effective tier, least urgent first.
const (
	ordinary   = iota // shortest job first
	agedUrgent        // promoted, aged into this tier
	ownUrgent         // promoted, of this tier
	bandsPerTier
)

// numBands is the number of bands; a higher index runs first.
const numBands = bandsPerTier * api.NumTiers

// band returns the band index of kind in effective tier rank.
func band(rank, kind int) int { return bandsPerTier*rank + kind }

// placement is where an entry belongs at one moment.
type placement struct {
	band       int
	promotedAt time.Time // zero when not promoted
	next       time.Time // the next change of band; zero for none
}

// place computes e's band at now from its enqueue time, the SLAs and the
// aging interval. It reads only e's bookkeeping set by Push.
func (s *PriorityScheduler[T]) place(e *Entry[T], now time.Time) placement {
	b := int(e.rank)
	if e.Urgent {
		return placement{band: band(b, ownUrgent), promotedAt: e.Enqueued}
	}
	lvl, reached := b, e.Enqueued // effective tier and when it got there
	var next time.Time
	high := api.High.Rank()
	if a := s.cfg.aging; a > 0 && b < high {
		steps := int64(0)
		if w := now.Sub(e.Enqueued); w > 0 {
			steps = int64(w / a)
		}
		lvl = b + int(min(steps, int64(high-b)))
		reached = e.Enqueued.Add(time.Duration(lvl-b) * a)
		if lvl < high {
			next = reached.Add(a)
		}
	}
	p := placement{band: band(lvl, ordinary), next: next}
	at := s.promotionTime(e, lvl, reached)
	switch {
	case at.IsZero():
	case now.Before(at):
		if p.next.IsZero() || at.Before(p.next) {
			p.next = at
		}
	default:
		kind := ownUrgent
		if lvl != b {
			kind = agedUrgent
		}
		p.band, p.promotedAt = band(lvl, kind), at
	}
	return p
}

// promotionTime is when e, in effective tier lvl since reached, moves
// ahead of that tier: in its own tier, when less than the promotion
// fraction of its SLA is left before its Deadline; in a tier it aged into,
// the same for an arrival of that tier at reached. At High, the tier
// aging stops at, an aged entry of a tier without SLA is promoted one
// aging interval after it got there, so aging alone still moves it on.
// Zero means never.
func (s *PriorityScheduler[T]) promotionTime(e *Entry[T], lvl int, reached time.Time) time.Time {
	sla, frac := s.cfg.sla[lvl], s.cfg.promotion
	switch {
	case lvl == int(e.rank) && sla > 0 && frac > 0 && !e.Deadline.IsZero():
		return e.Deadline.Add(-time.Duration(float64(sla) * frac))
	case lvl != int(e.rank) && sla > 0 && frac > 0:
		return reached.Add(sla - time.Duration(float64(sla)*frac))
	case lvl == api.High.Rank() && s.cfg.aging > 0 && (lvl != int(e.rank) || sla == 0 || frac == 0):
		return reached.Add(s.cfg.aging)
	}
	return time.Time{}
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
		if b%bandsPerTier != ordinary {
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
