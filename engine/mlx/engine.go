//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/metal"
)

// Engine loads checkpoints onto MLX. All its models share one MLX thread.
// It implements engine.Engine.
type Engine struct {
	opts   options
	w      *worker
	mu     sync.RWMutex // guards closed and models; held (read) while a job runs
	closed bool
	models map[unloader]struct{}
}

// unloader is a loaded model (a decoder's *model or an encoder's
// *encModel): Close unloads each on the MLX thread.
type unloader interface{ unload() }

var _ engine.Engine = (*Engine)(nil)

// New starts the engine's MLX thread and applies the memory limits the
// options set. Errors: a bad option, or MLX failing to start (no such
// device).
//
// MLX gives each thread that uses it a stream whose worker thread lives
// until the process exits, and offers no way to release it; so every
// Engine leaves one idle MLX thread behind after Close. Create one Engine
// per process and load every model into it.
func New(opts ...Option) (*Engine, error) {
	o := defaultOptions()
	if err := o.apply(opts); err != nil {
		return nil, err
	}
	metal.Init()
	if err := applyLimits(&o); err != nil {
		return nil, err
	}
	w, err := startWorker(o.device, o.fused)
	if err != nil {
		return nil, fmt.Errorf("mlx: start: %w", err)
	}
	return &Engine{opts: o, w: w, models: map[unloader]struct{}{}}, nil
}

func applyLimits(o *options) error {
	type limit struct {
		set bool
		n   uint64
		f   func(uint64) (uint64, error)
	}
	for _, l := range []limit{
		{o.setMemory, o.memoryLimit, metal.SetMemoryLimit},
		{o.setCache, o.cacheLimit, metal.SetCacheLimit},
		{o.setWired, o.wiredLimit, metal.SetWiredLimit},
	} {
		if l.set {
			if _, err := l.f(l.n); err != nil {
				return err
			}
		}
	}
	return nil
}

// Name returns "mlx".
func (e *Engine) Name() string { return "mlx" }

// runOpen runs job on the MLX thread unless closed is set, before it is
// queued or when it would start (a model closed meanwhile), returning
// engine.ErrClosed then.
func (e *Engine) runOpen(closed *atomic.Bool, job func(*graph) error) error {
	if closed.Load() {
		return engine.ErrClosed
	}
	var jerr error
	err := e.run(func(g *graph) {
		if closed.Load() {
			jerr = engine.ErrClosed
			return
		}
		jerr = job(g)
	})
	if err != nil {
		return err
	}
	return jerr
}

// run runs job on the MLX thread unless the engine is closed.
func (e *Engine) run(job func(*graph)) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return engine.ErrClosed
	}
	e.w.do(job)
	return nil
}

// Close unloads every model and stops the MLX thread.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	e.w.do(func(*graph) {
		for m := range e.models {
			m.unload()
		}
	})
	e.models = nil
	e.w.stop()
	return nil
}

// Load reads a checkpoint; see engine.Engine.
func (e *Engine) Load(ctx context.Context, spec engine.ModelSpec) (engine.Model, error) {
	if spec.ID == "" || spec.Path == "" {
		return nil, &engine.InvalidParamError{Param: "model spec", Reason: "ID and Path are required"}
	}
	if spec.MaxBatch < 0 || spec.KVCapacity < 0 || spec.ContextLength < 0 || spec.AdapterSlots < 0 || spec.MaxAdapterRank < 0 {
		return nil, &engine.InvalidParamError{Param: "model spec", Reason: "sizes must not be negative"}
	}
	if spec.AdapterSlots > maxAdapterSlots {
		return nil, &engine.InvalidParamError{Param: "model spec", Reason: fmt.Sprintf("AdapterSlots %d: at most %d", spec.AdapterSlots, maxAdapterSlots)}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg, err := readConfig(spec.Path)
	if err != nil {
		return nil, err
	}
	man, files, err := manifest(spec.Path)
	if err != nil {
		return nil, err
	}
	pc, err := engine.ReadPooling(spec.Path, cfg.Enc != nil)
	if err != nil {
		return nil, err
	}
	if cfg.Enc != nil {
		return e.loadEncoder(ctx, spec, cfg, pc, man, files)
	}
	// A transformers-quantized checkpoint (AWQ, GPTQ, compressed-tensors,
	// FP8): its quantized tensors are read by Go and converted
	// (hfquant.go); the manifest then lists what they become.
	var conv map[string]func() (hfTensor, error)
	var floatDType string
	if cfg.HF != nil {
		locate(cfg, man)
		floatDType = man[cfg.Prefix+"embed_tokens.weight"].DType
		if checkFloat(cfg.Prefix+"embed_tokens.weight", man[cfg.Prefix+"embed_tokens.weight"]) != nil {
			floatDType = "F32"
		}
		if man, conv, err = convertHF(cfg.HF, man, floatDType); err != nil {
			return nil, err
		}
	}
	mods, err := planModules(cfg, man)
	if err != nil {
		return nil, err
	}
	m := &model{eng: e, cfg: cfg, seqs: map[engine.SeqID]*seqState{}}
	if err := m.size(spec, weightBytes(man), kvElemBytes(man, cfg.Prefix)); err != nil {
		return nil, err
	}
	setPooling(&m.info, cfg.Hidden, pc)
	want, fromFile := map[string]bool{}, map[string]bool{}
	for _, md := range mods {
		for _, s := range []string{".weight", ".bias", ".scales", ".biases"} {
			want[md.Name+s] = true
			fromFile[md.Name+s] = conv[md.Name+s] == nil
		}
		want[md.Name+".perm"] = conv[md.Name+".perm"] != nil // act order's input order (hfint4.go)
		if md.Bare || md.Experts > 0 {
			for _, n := range stackedTensors(md) {
				want[n], fromFile[n] = true, true
			}
		}
	}
	var lerr error
	err = e.run(func(g *graph) {
		ts, err := loadTensors(ctx, g, files, fromFile)
		if err != nil {
			lerr = err
			return
		}
		if err := loadHF(g, conv, want, ts, floatDType); err != nil {
			for _, a := range ts {
				free(&a)
			}
			lerr = err
			return
		}
		if m.w, lerr = buildWeights(g, cfg, mods, ts); lerr != nil {
			return
		}
		m.adapters = newAdapters(m, g, spec.Path, m.info.AdapterSlots, m.info.MaxAdapterRank)
		m.info.AdapterBytes = m.adapters.stack.bytes(m.info.MaxAdapterRank)
		if m.pool = newPool(g, cfg, m.lay, m.w.dtype, m.rows); g.err != nil {
			m.pool.release()
			m.w.free()
			lerr = fmt.Errorf("mlx: %s: allocating the KV cache (%d bytes): %w: %w", spec.ID, m.info.KVBytes, engine.ErrOutOfMemory, g.err)
			return
		}
		if err := ctx.Err(); err != nil {
			m.pool.release()
			m.w.free()
			lerr = err
			return
		}
		e.models[m] = struct{}{}
	})
	if err == nil {
		err = lerr
	}
	if err != nil {
		return nil, err
	}
	e.opts.logger.Info("mlx: loaded", "model", spec.ID, "path", spec.Path, "layers", cfg.Layers, "kv_capacity", m.info.KVCapacity)
	return m, nil
}

// size fills the model's Info and lays out its KV pool, checking the
// weights and the pool fit MLX's memory limit.
func (m *model) size(spec engine.ModelSpec, wbytes, elemBytes uint64) error {
	c := m.cfg
	ctxLen := c.ContextLength
	if spec.ContextLength > 0 && spec.ContextLength < ctxLen {
		ctxLen = spec.ContextLength
	}
	maxBatch := spec.MaxBatch
	if maxBatch == 0 {
		maxBatch = m.eng.opts.maxBatch
	}
	limit, err := metal.MemoryLimit()
	if err != nil {
		return err
	}
	if wbytes >= limit {
		return fmt.Errorf("mlx: %s: weights take %d bytes, MLX's memory limit is %d: %w", spec.ID, wbytes, limit, engine.ErrOutOfMemory)
	}
	m.lay = newKVLayout(c, ctxLen)
	if m.eng.opts.keepWindows {
		m.lay = oneGroup(c)
	}
	// The pool pages by single rows (kvPool): BlockSize 1, a block per
	// token, and one sequence never outgrows it.
	m.info = engine.Info{ID: spec.ID, Engine: "mlx", VocabSize: c.Vocab, BOS: c.BOS, EOS: c.EOS, MaxBatch: maxBatch,
		BlockSize: 1, KVBlocks: 1, WeightBytes: int64(wbytes), Resumes: true, JumpForward: true,
		AdapterSlots: cmp.Or(spec.AdapterSlots, engine.DefaultAdapterSlots), MaxAdapterRank: cmp.Or(spec.MaxAdapterRank, engine.DefaultMaxAdapterRank)}
	m.describeWindows()
	rowBytes := 2 * uint64(c.KVHeads*c.HeadDim) * elemBytes
	perSeq := m.info.BlocksFor(ctxLen)
	blocks := spec.KVCapacity
	if blocks == 0 {
		budget := uint64(float64(limit-wbytes) * m.eng.opts.kvFraction)
		most := maxBatch * perSeq
		blocks = sort.Search(most, func(n int) bool { return m.lay.bytes(m.lay.rows(n+1, maxBatch), rowBytes) > budget })
		if blocks < perSeq {
			return fmt.Errorf("mlx: %s: no memory left for one sequence's KV cache: %w", spec.ID, engine.ErrOutOfMemory)
		}
	} else if b := m.lay.bytes(m.lay.rows(blocks, maxBatch), rowBytes); b > limit-wbytes { // the pool is allocated at load
		return fmt.Errorf("mlx: %s: a KV cache of %d tokens takes %d bytes; %d are left under MLX's memory limit: %w",
			spec.ID, blocks, b, limit-wbytes, engine.ErrOutOfMemory)
	}
	m.rows = m.lay.rows(blocks, maxBatch)
	m.info.KVBlocks, m.info.KVCapacity = blocks, blocks
	m.info.KVBytes = int64(m.lay.bytes(m.rows, rowBytes))
	m.info.ContextLength = sort.Search(ctxLen, func(n int) bool { return m.info.BlocksFor(n+1) > blocks })
	return nil
}

// describeWindows reports the sliding group in Info: Window, and when
// every layer slides, the pool's one group as engine.BlockPool's
// sliding group (a sequence is charged WindowBlocks at most). With full
// layers too, the full group's rows are the blocks: the sliding group
// has rows for MaxBatch+1 sequences' kept positions (kvLayout.rows),
// enough for a full batch of decodes beside one long prompt chunk; a
// step that needs more (several long chunks continuing prompts at
// once) fails with engine.ErrOutOfMemory, changing nothing.
func (m *model) describeWindows() {
	if !m.lay.sliding() {
		return
	}
	m.info.Window = m.cfg.Window
	if len(m.lay.groups) == 1 {
		m.info.SlidingGroups, m.info.WindowBlocks = 1, m.lay.windowBlocks()
	}
}

// kvElemBytes is the size of one KV value: the KV cache takes the dtype of
// the embedding (its scales when quantized; see buildWeights), 2 bytes for
// bf16/fp16 checkpoints, 4 for float32 ones.
func kvElemBytes(man map[string]tensorInfo, prefix string) uint64 {
	t, ok := man[prefix+"embed_tokens.scales"]
	if !ok {
		t = man[prefix+"embed_tokens.weight"]
	}
	switch t.DType {
	case "BF16", "F16":
		return 2
	default:
		return 4
	}
}
