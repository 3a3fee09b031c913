//go:build mlx

package mlx

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lora"
)

var _ engine.AdapterModel = (*model)(nil)

// adapters is a model's LoRA state: the registry of served adapters
// (AddAdapter, any goroutine, under mu) and the device slots that hold
// the resident ones (MLX thread only).
type adapters struct {
	maxRank int
	base    lora.Base // the model's projections, as lora.Check reads them
	baseErr error     // why the model's config.json gives no Base

	mu  sync.Mutex
	reg map[string]*adapterEntry

	// MLX thread only.
	slots []adapterSlot
	clock uint64
	stack *loraStack
}

// adapterEntry is one adapter as AddAdapter read it. A name added again
// gets a new entry: sequences opened before keep the old one, whose KV
// and slot are never taken for the new one's.
type adapterEntry struct {
	a    *lora.Adapter
	info engine.AdapterInfo
	// gone is set when the name is removed or replaced: the slot holding
	// the entry is free once its sequences end, and KV saved by them is
	// never reused.
	gone atomic.Bool
}

// adapterSlot is one device slot of the stacked LoRA weights.
type adapterSlot struct {
	e    *adapterEntry // nil: empty
	refs int           // open sequences using it
	used uint64        // clock at its last OpenAdapter: LRU eviction
}

// newAdapters sets up a decoder model's adapter state for slots slots of
// rank up to maxRank; no device memory is taken until an adapter is
// opened.
func newAdapters(m *model, g *graph, dir string, slots, maxRank int) *adapters {
	a := &adapters{maxRank: maxRank, reg: map[string]*adapterEntry{}, slots: make([]adapterSlot, slots)}
	a.base, a.baseErr = lora.ReadBase(dir)
	a.stack = newLoRAStack(m, slots, g.k.cpu)
	return a
}

// AddAdapter reads and checks the adapter at spec.Path and serves it as
// spec.Name; see engine.AdapterModel.
func (m *model) AddAdapter(ctx context.Context, spec engine.AdapterSpec) (engine.AdapterInfo, error) {
	if spec.Name == "" || spec.Path == "" {
		return engine.AdapterInfo{}, &engine.InvalidParamError{Param: "adapter", Reason: "name and path are required"}
	}
	if err := ctx.Err(); err != nil {
		return engine.AdapterInfo{}, err
	}
	if m.closed.Load() {
		return engine.AdapterInfo{}, engine.ErrClosed
	}
	ad := m.adapters
	if ad.baseErr != nil {
		return engine.AdapterInfo{}, ad.baseErr
	}
	a, err := lora.Read(spec.Path)
	if err != nil {
		return engine.AdapterInfo{}, err
	}
	if err := a.Check(ad.base, ad.maxRank); err != nil {
		return engine.AdapterInfo{}, err
	}
	for _, p := range a.Pairs { // lora.Base and the loaded layers agree; this guards the slot writes
		if part := ad.stack.part(p.Layer, p.Module); part == nil || part.in != p.In || part.out != p.Out {
			return engine.AdapterInfo{}, &engine.CheckpointError{Path: spec.Path, Tensor: p.A,
				Reason: fmt.Sprintf("layer %d has no %s this engine adapts", p.Layer, p.Module)}
		}
	}
	if err := a.CheckFinite(); err != nil {
		return engine.AdapterInfo{}, err
	}
	e := &adapterEntry{a: a, info: a.Info(spec.Name, dtypeSize(ad.stack.dt))}
	e.info.Pinned = spec.Pinned
	ad.mu.Lock()
	defer ad.mu.Unlock()
	if m.closed.Load() {
		return engine.AdapterInfo{}, engine.ErrClosed
	}
	pinned := 0
	for name, x := range ad.reg {
		if x.info.Pinned && name != spec.Name {
			pinned++
		}
	}
	if err := engine.CheckPin(spec, len(ad.slots), pinned); err != nil {
		return engine.AdapterInfo{}, err
	}
	if old := ad.reg[spec.Name]; old != nil {
		old.gone.Store(true)
	}
	ad.reg[spec.Name] = e
	return e.info, nil
}

// RemoveAdapter stops serving name; see engine.AdapterModel.
func (m *model) RemoveAdapter(name string) error {
	ad := m.adapters
	ad.mu.Lock()
	defer ad.mu.Unlock()
	e := ad.reg[name]
	if e == nil {
		return fmt.Errorf("mlx: %s: adapter %q: %w", m.info.ID, name, engine.ErrModelNotFound)
	}
	e.gone.Store(true)
	delete(ad.reg, name)
	return nil
}

// Adapters lists the adapters served, by name; see engine.AdapterModel.
func (m *model) Adapters() []engine.AdapterInfo {
	ad := m.adapters
	ad.mu.Lock()
	defer ad.mu.Unlock()
	out := make([]engine.AdapterInfo, 0, len(ad.reg))
	for _, e := range ad.reg {
		out = append(out, e.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// OpenAdapter is Open for a sequence of adapter (empty: the base); see
// engine.AdapterModel.
func (m *model) OpenAdapter(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey, adapter string) (int, error) {
	if adapter == "" {
		return m.Open(ctx, id, prompt, prefixKey)
	}
	ad := m.adapters
	ad.mu.Lock()
	e := ad.reg[adapter]
	ad.mu.Unlock()
	if e == nil {
		return 0, fmt.Errorf("mlx: %s: adapter %q: %w", m.info.ID, adapter, engine.ErrModelNotFound)
	}
	return m.open(ctx, id, prompt, prefixKey, e)
}

// resident returns the slot holding e, loading e into a free slot or the
// least recently used one no open sequence uses and not pinned (one whose
// adapter was removed or replaced first), and counts one more sequence using it. MLX thread only.
func (m *model) resident(g *graph, e *adapterEntry) (int, error) {
	ad := m.adapters
	ad.clock++
	if i := slices.IndexFunc(ad.slots, func(s adapterSlot) bool { return s.e == e }); i >= 0 {
		ad.slots[i].refs++
		ad.slots[i].used = ad.clock
		return i, nil
	}
	// A slot no sequence uses ranks by what it holds: nothing or an
	// adapter no longer served first, then the least recently opened.
	rank := func(s adapterSlot) uint64 {
		if s.e == nil || s.e.gone.Load() {
			return 0
		}
		return s.used
	}
	pick := -1
	for i, s := range ad.slots {
		pinned := s.e != nil && !s.e.gone.Load() && s.e.info.Pinned
		if s.refs == 0 && !pinned && (pick < 0 || rank(s) < rank(ad.slots[pick])) {
			pick = i
		}
	}
	if pick < 0 {
		return 0, fmt.Errorf("mlx: %s: all %d adapter slots hold adapters of open sequences or pinned ones: %w", m.info.ID, len(ad.slots), engine.ErrOutOfMemory)
	}
	ad.slots[pick] = adapterSlot{} // whatever happens next, the old adapter is gone from it
	if err := ad.stack.load(g, pick, e.a); err != nil {
		return 0, err
	}
	ad.slots[pick] = adapterSlot{e: e, refs: 1, used: ad.clock}
	return pick, nil
}

// release drops s's use of its adapter slot. MLX thread only.
func (m *model) release(s *seqState) {
	if !s.inSlot {
		return
	}
	s.inSlot = false
	sl := &m.adapters.slots[s.slot]
	if sl.e == s.lora && sl.refs > 0 {
		sl.refs--
	}
}

// dropGoneSaved discards saved KV of adapters removed or replaced, which
// no sequence can reuse, and reports their keys as evicted
// (EvictedSaved). MLX thread only.
func (m *model) dropGoneSaved() {
	m.saved = slices.DeleteFunc(m.saved, func(e *savedKV) bool {
		if e.seq.lora != nil && e.seq.lora.gone.Load() {
			e.free()
			m.evicted = append(m.evicted, e.key)
			return true
		}
		return false
	})
}
