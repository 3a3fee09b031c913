package pyproc

import (
	"context"

	"github.com/mlxserving/mlxserving/engine"
)

// Paged KV: each worker keeps the model's KV in a pool of fixed-size
// blocks (PROTOCOL.md, "KV blocks") and reports its free blocks in every
// open, step and free reply. The Model remembers the newest report per
// worker. Free does not wait for its reply (it would cost the caller a
// round trip per finished sequence); the replies are read after the next
// reply the Model waits for anyway, or by FreeBlocks, which needs them.

var _ engine.BlockPool = (*Model)(nil)

// workerPool is what the Model knows of one worker's block pool.
type workerPool struct {
	free  int           // free blocks as of the reply to request at
	at    uint64        // the request whose reply set free
	frees []sentRequest // free requests whose replies were not read yet
	// owed is the sum of the owed blocks of the sequences open on the
	// worker (seqRef.owed): blocks their prompts will take that free
	// does not show yet.
	owed int
}

type sentRequest struct {
	id uint64
	ch chan *reply
}

// poolOf returns the state kept for worker p, making it when needed: a
// worker that never answered for this model has its whole pool free.
func (m *Model) poolOf(p *proc) *workerPool {
	wp := m.pools[p]
	if wp == nil {
		wp = &workerPool{free: m.blocksPer[p.slot]}
		m.pools[p] = wp
	}
	return wp
}

// owe sets the blocks sequence id (open on its worker) will take for
// the prompt tokens not fed yet: a worker takes a sequence's blocks as
// its prompt is fed, not at open, so without them the sequences opened
// in one admission round, or while a step is out, would all be routed by
// the same free blocks (roomFor). Only a paged model owes blocks.
func (m *Model) owe(id engine.SeqID, blocks int) {
	ref, ok := m.seqs[id]
	if !ok || !m.info.Paged() {
		return
	}
	blocks = max(blocks, 0)
	m.poolOf(ref.proc).owed += blocks - ref.owed
	ref.owed = blocks
	m.seqs[id] = ref
}

// owedFor is what a sequence of n prompt tokens owes once reused of them
// are held (a reused prefix's blocks are the worker's already).
func (m *Model) owedFor(n, reused int) int {
	return m.info.BlocksFor(n) - m.info.BlocksFor(reused)
}

// paid pays down the owed blocks of the inputs of r's group g on worker
// p, which ran it: its reply's free blocks count what they took. The
// input that samples fed the prompt's last chunk and owes nothing more.
// A worker that owes nothing (decode steps) costs no per-row lookup.
func (m *Model) paid(p *proc, r *stepRun, g *stepGroup) {
	if wp := m.pools[p]; wp == nil || wp.owed == 0 {
		return
	}
	for _, i := range g.idx {
		in := &r.batch[i]
		ref, ok := m.seqs[in.Seq]
		if !ok || ref.owed == 0 {
			continue
		}
		left := 0
		if !in.Sample {
			left = ref.owed - m.info.BlocksFor(len(in.Tokens))
		}
		m.owe(in.Seq, left)
	}
}

// forgive drops what a freed sequence owed from its worker's sum.
func (m *Model) forgive(ref seqRef) {
	if wp := m.pools[ref.proc]; wp != nil {
		wp.owed -= ref.owed
	}
}

// noteReply takes the pool report and the evicted keys of the reply to
// request id on worker p. Replies of one worker come in request order, but
// free replies are read late: the newest report wins.
func (m *Model) noteReply(p *proc, id uint64, r *reply) {
	if r == nil {
		return
	}
	if r.FreeBlocks != nil {
		wp := m.poolOf(p)
		if id > wp.at {
			wp.free, wp.at = *r.FreeBlocks, id
		}
	}
	m.noteEvicted(p, id, r.Evicted)
}

// sentFree records a free request whose reply is read later.
func (m *Model) sentFree(p *proc, id uint64, ch chan *reply) {
	wp := m.poolOf(p)
	wp.frees = append(wp.frees, sentRequest{id, ch})
}

// readFrees reads the replies to the free requests sent to p. With no
// step or open out it waits for them (they come quickly: a free is cheap,
// and nothing else is in flight); with one out it reads those that
// arrived, since a free sent behind a pending step is answered after it
// (pipeline.go). A worker that died answers none.
func (m *Model) readFrees(p *proc) { m.takeFrees(p, m.inflight == 0) }

// readArrivedFrees reads the replies to the free requests sent to p that
// have arrived: after a reply, those to the frees sent before it.
func (m *Model) readArrivedFrees(p *proc) { m.takeFrees(p, false) }

func (m *Model) takeFrees(p *proc, block bool) {
	wp := m.pools[p]
	if wp == nil || len(wp.frees) == 0 {
		return
	}
	n := 0
	for _, f := range wp.frees {
		if !block && len(f.ch) == 0 && p.alive() {
			break // replies come in request order: the later ones are not here either
		}
		n++
		r, err := p.wait(context.Background(), m.spec.ID, f.id, f.ch)
		if err == nil {
			m.noteReply(p, f.id, r)
		}
	}
	wp.frees = append(wp.frees[:0], wp.frees[n:]...)
}

// FreeBlocks returns the KV blocks sequences can take now (see
// engine.BlockPool), counting blocks held only by saved prefixes or the
// prefix cache: the sum over the live workers, as Info.KVBlocks is the
// sum of their pools. With several workers each sequence draws from the
// pool of the worker it was opened on (Open prefers those with room), so
// a step can still find one worker short while others have room: that
// worker refuses its part, changing nothing, while the others run
// theirs, and the step returns an *engine.PartialStepError; the caller
// gives back blocks of the inputs that did not run (the batcher preempts
// one of their sequences) and steps them again. While a step or open is
// out (engine.Pipeliner) it does not wait for it: it counts the free
// replies that arrived. A worker that died took its blocks with it; its
// replacement starts with a whole pool. Zero for
// a model that does not page, and when no worker is up.
func (m *Model) FreeBlocks() int {
	if !m.info.Paged() || m.closed.Load() {
		return 0
	}
	free := 0
	for _, s := range m.e.slots {
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		if p == nil || !p.alive() {
			continue
		}
		m.readFrees(p)
		free += m.poolOf(p).free
	}
	m.forgetDeadPools()
	return free
}

// forgetDeadPools drops the state of workers that died.
func (m *Model) forgetDeadPools() {
	for p := range m.pools {
		if !p.alive() {
			delete(m.pools, p)
		}
	}
}
