package pyproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/engine"
)

// Model is a checkpoint loaded on every worker of an Engine. It implements
// engine.Model: Open, Step and Free are serialised by the caller; Info is
// safe for concurrent use. Models come from Engine.Load; the zero value is
// not usable.
type Model struct {
	e      *Engine
	handle string // the model's name on the workers: unique per Load
	spec   engine.ModelSpec
	info   engine.Info
	closed atomic.Bool

	seqs map[engine.SeqID]seqRef
	// fresh holds the open sequences no step was sent for yet: an Opening
	// input may feed them (pipeline.go).
	fresh map[engine.SeqID]struct{}
	// pooled holds the open embedding sequences (embed.go); stepCap is
	// the tokens one encoder step may carry to a worker.
	pooled  map[engine.SeqID]*pooledSeq
	stepCap int

	// Saved KV: which worker holds each key, the keys workers reported
	// evicted and not yet collected by EvictedSaved, routing counters.
	saved                        map[string]*proc
	savedAt                      map[string]uint64 // the free request that saved each key
	byProc                       map[*proc]map[string]struct{}
	evicted                      []string
	affinityHits, affinityMissed int64
	// Lookahead (lookahead.go): tokens per worker round trip, 1 when off,
	// and the tokens decoded ahead per sequence.
	k     int
	look  map[engine.SeqID]*ahead
	loops loopAdapt // how far constrained inputs decode ahead

	// Paged KV (blocks.go): each worker's pool as its replies report it,
	// and each worker's pool size by slot index.
	pools     map[*proc]*workerPool
	blocksPer []int

	// LoRA adapters (adapter.go): the registry (amu: AddAdapter and the
	// like run concurrently with everything), each worker's slots as
	// assigned, the bytes one slot takes. smu guards the slots: an
	// adapter sequence's open holds it from its claim to its outcome, and
	// WarmAdapter and a restart's warm-up (adapterwarm.go) take it too, so
	// a slot is never claimed twice. Taken before amu, never after.
	amu       sync.RWMutex
	adapters  map[string]*served
	agen      uint64
	smu       sync.Mutex
	resident  map[*proc][]slotState
	atick     uint64
	slotBytes int64
	// savedBy names the adapter key of each key saved by an adapter's
	// sequence; gone counts adapters removed or replaced, swept the
	// count of them EvictedSaved has dropped the saved KV of.
	savedBy     map[string]string
	gone, swept atomic.Uint64

	// Steps' scratch, reused (Step is serialised): runs not out now.
	spare []*stepRun
	// Pipelining (pipeline.go): whether every worker pipelines, the step
	// sent and not yet waited for, the opens sent and not yet waited
	// for, and how many steps and opens are out.
	pipelines bool
	pending   *pendingStep
	opening   map[engine.SeqID]*pendingOpen
	inflight  int
}

// seqRef is where a sequence lives: the worker it was opened on. If that
// worker died since, the sequence is gone.
type seqRef struct {
	slot *slot
	proc *proc
	done func(error) // reports the outcome to the slot's breaker; nil if it refused
	// adapter is 1 + the worker's adapter slot the sequence runs; 0: the
	// base. akey is the adapter's key on the workers.
	adapter int
	akey    string
	// owed is the blocks the sequence's prompt will still take of its
	// worker's pool (owe).
	owed int
}

var _ engine.Model = (*Model)(nil)

// Load loads the checkpoint on every worker. It returns when all have it;
// if ctx ends first it returns ctx.Err() and unloads it again.
func (e *Engine) Load(ctx context.Context, spec engine.ModelSpec) (engine.Model, error) {
	if spec.ID == "" || spec.Path == "" {
		return nil, &engine.InvalidParamError{Param: "model", Reason: "ModelSpec needs an ID and a Path"}
	}
	if spec.MaxBatch < 0 || spec.KVCapacity < 0 || spec.ContextLength < 0 {
		return nil, &engine.InvalidParamError{Param: "model", Reason: "ModelSpec sizes must not be negative"}
	}
	if e.isClosed() {
		return nil, engine.ErrClosed
	}
	// The worker runs in its runtime directory: a relative path is this
	// process's. (Abs fails only without a working directory; the path
	// then goes as given, and the worker's error names it.)
	if abs, err := filepath.Abs(spec.Path); err == nil {
		spec.Path = abs
	}
	m := &Model{e: e, spec: spec, seqs: map[engine.SeqID]seqRef{}, fresh: map[engine.SeqID]struct{}{}, pooled: map[engine.SeqID]*pooledSeq{}, opening: map[engine.SeqID]*pendingOpen{}, saved: map[string]*proc{}, savedAt: map[string]uint64{}, byProc: map[*proc]map[string]struct{}{}, look: map[engine.SeqID]*ahead{},
		pools: map[*proc]*workerPool{}, adapters: map[string]*served{}, resident: map[*proc][]slotState{}, savedBy: map[string]string{},
		handle: spec.ID + "#" + strconv.FormatUint(e.nextID.Add(1), 10)}
	infos := make([]*wireInfo, len(e.slots))
	errs := make([]error, len(e.slots))
	var wg sync.WaitGroup
	for i, s := range e.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.current(ctx, e.closing)
			if err == nil {
				var r *reply
				if r, err = p.call(ctx, spec.ID, m.loadRequest()); err == nil {
					infos[i] = r.Info
				}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil || infos[0] == nil {
		m.unload()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, firstError(errs)
	}
	m.info = m.infoFrom(infos)
	m.adapterInfo(infos)
	if err := m.embedInfo(infos[0]); err != nil {
		m.unload()
		return nil, err
	}
	for _, w := range infos {
		m.blocksPer = append(m.blocksPer, w.KVBlocks)
	}
	m.k = lookaheadFor(e.cfg.lookahead, infos[0].Device, m.hellos())
	m.loops.run = float64(m.k) // optimistic until rounds tell otherwise
	m.info.Resumes = capable(m.hellos(), "resume")
	m.info.JumpForward = capable(m.hellos(), "jump_forward")
	m.pipelines = capable(m.hellos(), "pipeline")
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, engine.ErrClosed
	}
	e.models[m] = struct{}{}
	return m, nil
}

func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: no worker answered", engine.ErrWorkerLost)
}

func (m *Model) loadRequest() builder {
	return request("load", map[string]any{
		"model": m.handle,
		"path":  m.spec.Path,
		"opts": map[string]any{
			"max_batch":      m.spec.MaxBatch,
			"kv_capacity":    kvShare(m.spec.KVCapacity, len(m.e.slots)),
			"context_length": m.spec.ContextLength,
			"device":         m.e.cfg.device,
			"dtype":          m.e.cfg.dtype,
			"cuda_graphs":    !m.e.cfg.noGraphs,
			"quantize":       m.e.cfg.quantize,
			"kv_cache_dtype": m.e.cfg.kvCacheDtype,
			// LoRA slots (adapter.go); a backend without adapters ignores them.
			"adapter_slots":    m.adapterSlots(),
			"max_adapter_rank": m.maxRank(),
		},
	})
}

// capable reports whether every worker whose handshake is among hellos
// lists capability name as true: "resume" (it follows
// engine.SamplingParams.Generated) or "jump_forward" (it counts forced
// tokens as generated, engine.Info.JumpForward); see PROTOCOL.md. A
// replacement worker runs the same runtime and backend, so the answer
// holds for the model's life.
func capable(hellos []reply, name string) bool {
	for _, h := range hellos {
		if on, _ := h.Caps[name].(bool); !on {
			return false
		}
	}
	return len(hellos) > 0
}

// hellos are the handshakes of the workers running now.
func (m *Model) hellos() []reply {
	var hs []reply
	for _, s := range m.e.slots {
		s.mu.Lock()
		if s.cur != nil {
			hs = append(hs, s.cur.hello)
		}
		s.mu.Unlock()
	}
	return hs
}

// kvShare is one worker's part of the model's KV capacity; zero lets the
// workers size it from memory.
func kvShare(total, workers int) int {
	if total == 0 {
		return 0
	}
	return max(1, total/workers)
}

func (m *Model) infoFrom(infos []*wireInfo) engine.Info {
	w := infos[0]
	info := engine.Info{ID: m.spec.ID, Engine: "pyproc", ContextLength: w.ContextLength,
		VocabSize: w.VocabSize, BOS: w.BOS, EOS: w.EOS, MaxBatch: w.MaxBatch, BlockSize: w.BlockSize,
		StepTokens: w.StepTokens, FullGroups: w.FullGroups, SlidingGroups: w.SlidingGroups, Window: w.Window,
		WindowBlocks: w.WindowBlocks}
	for _, x := range infos {
		ranks := int64(max(1, x.TP)) // a tensor-parallel worker reports one rank's bytes
		info.TensorParallel = max(info.TensorParallel, x.TP)
		info.KVCapacity += x.KVCapacity
		info.WeightBytes += x.WeightBytes * ranks
		info.KVBytes += x.KVBytes * ranks
		info.KVBlocks += x.KVBlocks
		info.ContextLength = min(info.ContextLength, x.ContextLength)
	}
	if info.KVBlocks == 0 || info.BlockSize == 0 { // a backend that does not page
		info.BlockSize, info.KVBlocks = 0, 0
	}
	return info
}

// unload removes the model from every live worker, waiting for them.
func (m *Model) unload() {
	var wg sync.WaitGroup
	for _, s := range m.e.slots {
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		if p == nil || !p.alive() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = p.call(context.Background(), m.spec.ID, request("unload", map[string]any{"model": m.handle}))
		}()
	}
	wg.Wait()
}

// Info describes the model.
func (m *Model) Info() engine.Info { return m.info }

func (m *Model) usable() error {
	if m.closed.Load() || m.e.isClosed() {
		return engine.ErrClosed
	}
	return nil
}

// Open routes the sequence to the worker holding the KV saved under
// prefixKey unless that worker is over the load bound (see affinityLoad),
// lacks the blocks for the prompt (roomFor) or its circuit breaker
// refuses, else to the least-loaded live worker whose breaker admits it
// (see WithBreaker), those with the blocks for the prompt first, and
// reserves its KV there. A worker being restarted is waited for (within
// ctx) when no other can take it.
//
// An encoder (Info.Encoder) only embeds: Open fails with an
// *engine.InvalidParamError; use OpenPooled.
func (m *Model) Open(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string) (int, error) {
	if err := m.usable(); err != nil {
		return 0, err
	}
	if m.info.Encoder {
		return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q is an encoder: it embeds (OpenPooled) and does not generate", m.spec.ID)}
	}
	return m.open(ctx, id, prompt, prefixKey, engine.PoolNone)
}

// open opens a generating sequence (pool PoolNone) or a pooled one.
func (m *Model) open(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string, pool engine.Pooling) (int, error) {
	return m.openWith(ctx, id, prompt, prefixKey, pool, nil)
}

// openWith is open for a sequence that runs adapter a (nil: the base).
func (m *Model) openWith(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string, pool engine.Pooling, a *served) (int, error) {
	if err := m.checkOpen(id, prompt); err != nil {
		return 0, err
	}
	s, done := m.route(prefixKey, a, len(prompt))
	p, err := s.current(ctx, m.e.closing)
	if err == nil {
		var (
			r   *reply
			rid uint64
			ch  chan *reply
		)
		fields := m.openFields(id, prompt, prefixKey)
		if pool != engine.PoolNone {
			fields["pool"] = pool.String()
		}
		aslot, load := -1, false
		if a != nil {
			for {
				m.smu.Lock()
				w := m.warming(p, a)
				if w == nil {
					break
				}
				m.smu.Unlock()
				select {
				case <-w:
				case <-ctx.Done():
					if done != nil {
						done(context.Canceled)
					}
					return 0, ctx.Err()
				}
			}
			defer m.smu.Unlock()
			if aslot, load, err = m.claim(p, a); err != nil {
				if done != nil {
					done(context.Canceled) // the worker was not asked: not counted either way
				}
				if s, p, done = m.slotFor(p, a); s == nil {
					return 0, err
				}
				aslot, load, _ = m.claim(p, a)
			}
			fields["adapter"] = adapterField(a, aslot, load)
		}
		// A ctx that ended while this open waited (for a warm-up's load)
		// sends nothing: an open the worker ran after its caller left
		// would hold KV no Free reaches.
		if err = ctx.Err(); err == nil {
			if rid, ch, err = p.send(request("open", fields), true); err == nil {
				r, err = p.wait(ctx, m.spec.ID, rid, ch)
			}
		}
		m.readArrivedFrees(p) // answered before this open
		if a != nil {
			m.hold(p, a, aslot, load, err)
		}
		if err == nil {
			m.noteReply(p, rid, r)
			ref := seqRef{slot: s, proc: p, done: done, adapter: aslot + 1}
			if a != nil {
				ref.akey = a.key
			}
			m.seqs[id] = ref
			m.owe(id, m.owedFor(len(prompt), r.Reused))
			m.fresh[id] = struct{}{}
			if pool != engine.PoolNone {
				m.pooled[id] = &pooledSeq{pool: pool}
			}
			s.open.Add(1)
			return r.Reused, nil
		}
	}
	if done != nil {
		done(err)
	}
	return 0, err
}

// checkOpen checks an open's sequence and prompt.
func (m *Model) checkOpen(id engine.SeqID, prompt []int32) error {
	if len(prompt) == 0 {
		return &engine.InvalidParamError{Param: "prompt", Reason: "empty"}
	}
	if len(prompt) > m.info.ContextLength {
		return &engine.ContextLengthError{Model: m.spec.ID, Prompt: len(prompt), Limit: m.info.ContextLength}
	}
	if _, ok := m.seqs[id]; ok {
		return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is already open", id)}
	}
	return nil
}

// openFields are an open request's fields.
func (m *Model) openFields(id engine.SeqID, prompt []int32, prefixKey string) map[string]any {
	return map[string]any{"model": m.handle, "seq": uint64(id), "prompt": prompt, "key": prefixKey}
}

// pickSlot routes a new sequence of n prompt tokens: the live worker
// with the fewest open sequences among those whose breaker admits it,
// those whose pool has the blocks for the prompt first (roomFor). When
// every breaker refuses, it takes the first worker in that order without
// its breaker's admission (done is nil then).
func (m *Model) pickSlot(n int) (*slot, func(error)) {
	order := make([]*slot, len(m.e.slots))
	up := make(map[*slot]bool, len(m.e.slots))
	room := make(map[*slot]bool, len(m.e.slots))
	for i, s := range m.e.slots {
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		up[s] = p != nil && p.alive()
		room[s] = up[s] && m.roomFor(p, n)
		order[i] = s
	}
	first := func(x, y bool) int { // x before y
		switch {
		case x == y:
			return 0
		case x:
			return -1
		}
		return 1
	}
	slices.SortStableFunc(order, func(a, b *slot) int {
		if c := first(up[a], up[b]); c != 0 {
			return c
		}
		if c := first(room[a], room[b]); c != 0 {
			return c
		}
		return cmp.Compare(a.open.Load(), b.open.Load())
	})
	for _, s := range order {
		if done, err := s.breaker.Allow(); err == nil {
			return s, done
		}
	}
	return order[0], nil
}

// roomFor reports whether worker p's pool has the blocks a new sequence
// of n prompt tokens takes, and its first token's: the free blocks its
// replies last reported less those its open sequences' unfed prompts
// owe (owe). Always on a model that does not page. The batcher admits
// by the pools' sum (engine.BlockPool): a sequence routed to a worker
// without them would have its steps refused there, and, preempted, be
// admitted again to the same worker, while the others have room.
func (m *Model) roomFor(p *proc, n int) bool {
	if !m.info.Paged() {
		return true
	}
	m.readArrivedFrees(p) // blocks that finished sequences gave back
	wp := m.poolOf(p)
	return wp.free-wp.owed >= m.info.BlocksFor(n+1) // and the first token's
}

// Free releases the sequence. The request is sent without waiting for its
// reply; the worker handles it before anything sent later. A pooled
// sequence is never saved: saveKey is ignored.
func (m *Model) Free(id engine.SeqID, saveKey string) {
	ref, ok := m.seqs[id]
	if !ok {
		return
	}
	delete(m.seqs, id)
	delete(m.fresh, id)
	m.forgive(ref)
	if po := m.opening[id]; po != nil { // its Wait reports the outcome
		po.freed = true
		delete(m.opening, id)
	}
	m.release(ref)
	if m.pooled[id] != nil {
		delete(m.pooled, id)
		saveKey = ""
	}
	if ref.done != nil {
		if ref.proc.alive() {
			ref.done(nil)
		} else {
			ref.done(ref.proc.lost())
		}
	}
	fields := map[string]any{"model": m.handle, "seq": uint64(id), "key": saveKey}
	if st := m.look[id]; st != nil {
		delete(m.look, id)
		if len(st.buf) > 0 {
			fields["back"] = len(st.buf) // decoded ahead, never fed by the caller
		}
	}
	if ref.proc.alive() && !m.closed.Load() {
		ref.slot.open.Add(-1)
		// A paged worker's reply tells its free blocks: read later (blocks.go).
		rid, ch, err := ref.proc.send(request("free", fields), m.info.Paged())
		if err == nil && ch != nil {
			m.sentFree(ref.proc, rid, ch)
		}
		if err == nil && saveKey != "" {
			m.noteSaved(saveKey, ref.proc, rid)
			if ref.akey != "" {
				m.savedBy[saveKey] = ref.akey
			} else {
				delete(m.savedBy, saveKey)
			}
		}
	}
}

// Close unloads the model from every worker and returns when that is done.
func (m *Model) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	m.e.mu.Lock()
	delete(m.e.models, m)
	m.e.mu.Unlock()
	if !m.e.isClosed() {
		m.unload()
	}
	for _, ref := range m.seqs {
		if ref.done != nil {
			ref.done(context.Canceled) // not counted either way
		}
	}
	m.seqs, m.fresh, m.saved, m.savedAt, m.byProc, m.evicted, m.pools, m.pooled = nil, nil, nil, nil, nil, nil, nil, nil
	m.smu.Lock()
	m.resident = nil
	m.smu.Unlock()
	return nil
}
