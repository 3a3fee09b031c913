package batcher

import (
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// Paged KV. When the model keeps its KV in blocks (engine.Info.Paged and
// engine.BlockPool), the batcher does not reserve a sequence's whole
// possible length at admission, as it must for a model that does not
// page: it admits a sequence while the blocks for its prompt are free
// (vLLM's rule, with a watermark of 1% of the pool kept for running
// sequences to grow into), sequences take blocks as they are fed, and a
// step that would need more blocks than are free first drops prompt
// chunks, then preempts running sequences — the lowest tier, the most
// recently admitted first — which go back to the queue and later
// recompute their prompt and the tokens they generated. An admitted
// request never fails for want of blocks and the pool cannot deadlock:
// a sequence alone always fits, as the engine caps the context at what
// its pool holds.

// pagedPool returns the model's block pool, or nil when it does not page.
func pagedPool(m engine.Model, info engine.Info) engine.BlockPool {
	if !info.Paged() {
		return nil
	}
	p, _ := m.(engine.BlockPool)
	return p
}

// grows is the blocks s takes when n more tokens are fed to it after
// what the pending step feeds it.
func (b *ContinuousBatcher) grows(s *Sequence, n int) int {
	kv := s.kv + s.ahead
	return b.info.BlocksFor(kv+n) - b.info.BlocksFor(kv)
}

// blocksLeft is what the running batch leaves of the pool: the free
// blocks less those the sequences still prefilling will take to finish
// their prompts, and less the watermark.
func (b *ContinuousBatcher) blocksLeft() int {
	left := b.freeBlocks() - max(1, b.info.KVBlocks/100)
	for _, e := range b.running {
		if s := e.Value; s.fed+s.ahead < len(s.feed) {
			left -= b.grows(s, len(s.feed)-s.fed-s.ahead)
		}
	}
	return left
}

// freeBlocks asks the engine for its free blocks and remembers the answer
// for the stats. It leaves out the blocks the pending step takes, which
// the engine's answer may not count yet (engine.Pipeliner).
func (b *ContinuousBatcher) freeBlocks() int {
	n := b.pool.FreeBlocks()
	b.lastFree = n
	if b.pend != nil {
		n -= b.pend.blocks
	}
	return n
}

// fitsBlocks is the admission test of a paged model: a free batch slot
// and the blocks for the whole feed (prompt, plus the tokens generated
// before a preemption) beyond what the batch already counts on.
func (b *ContinuousBatcher) fitsBlocks(s *Sequence) bool {
	if len(b.running) == 0 {
		return true
	}
	if len(b.running) >= b.limit {
		return false
	}
	if !b.leftValid {
		b.left, b.leftValid = b.blocksLeft(), true
	}
	return b.info.BlocksFor(len(s.Prompt)+len(s.generated)) <= b.left
}

// admittedBlocks counts an admitted sequence's feed against what the
// round has left.
func (b *ContinuousBatcher) admittedBlocks(s *Sequence) {
	if b.leftValid {
		b.left -= b.info.BlocksFor(len(s.feed))
	}
}

// roomForDecodes makes sure this step's decodes find their blocks,
// preempting while they do not, and returns the blocks left for prompt
// chunks. A sequence alone is never preempted: if the engine still has
// no room, its step fails with ErrOutOfMemory and the retry policy
// decides.
//
// Behind a pending step it preempts nothing: a victim's blocks would come
// back only after the engine ran the pending step, and the free blocks it
// reports would not show them yet. It asks for the pending step to be
// delivered first instead (b.wantDrain) and returns 0.
func (b *ContinuousBatcher) roomForDecodes() int {
	for {
		need := 0
		for _, e := range b.running {
			if s := e.Value; b.decodes(s) {
				need += b.grows(s, 1+s.forced)
			}
		}
		free := b.freeBlocks()
		if need <= free || len(b.running) <= 1 {
			return max(free-need, 0)
		}
		if b.pend != nil {
			b.wantDrain = true
			return 0
		}
		b.preemptForBlocks()
	}
}

// chunkForBlocks caps a prompt chunk of n tokens for s, fed after what
// the pending step feeds it, at what left blocks hold.
func (b *ContinuousBatcher) chunkForBlocks(s *Sequence, n, left int) int {
	return min(n, max(b.info.TokensFor(s.kv+s.ahead, left), 0))
}

// preemptRefused gives back blocks after the engine refused step in, or
// inputs in of a step it ran in part, for want of them: it preempts one
// of their sequences, which hold blocks of the pool that refused. Any
// other running sequence may hold its blocks in another worker's pool
// (one admitted while the step was out, its open not answered yet, is
// not in it): preempting it would give the short worker nothing. It
// preempts nothing when none of them runs any more (finished or
// cancelled while the step was out: their blocks went back already),
// nor the one sequence left running.
//
// Admission then waits until a step runs whole (b.refused): the batcher
// admits by the pools' sum, and the engine may route a sequence admitted
// now, the victim among others, to the worker that refused, whose
// sequences would be refused with it again and again while it is
// preempted and admitted in turn, none of them ever stepping.
func (b *ContinuousBatcher) preemptRefused(in []engine.StepInput) {
	b.refused = true
	if len(b.running) <= 1 {
		return
	}
	victim := b.victim(func(e *Entry) bool {
		return slices.ContainsFunc(in, func(x engine.StepInput) bool { return x.Seq == e.Value.id })
	})
	if victim < 0 {
		return
	}
	b.preempt(victim)
	b.count(&b.stats.BlockPreemptions)
}

// preemptForBlocks preempts the lowest-tier, most recently admitted
// running sequence to give its blocks back. It reports whether there was
// one to preempt.
func (b *ContinuousBatcher) preemptForBlocks() bool {
	victim := b.victim(func(*Entry) bool { return true })
	if victim < 0 {
		return false
	}
	b.preempt(victim)
	b.count(&b.stats.BlockPreemptions)
	return true
}
