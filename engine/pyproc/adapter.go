package pyproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lora"
)

var _ engine.AdapterModel = (*Model)(nil)

// served is an adapter in the registry: what AddAdapter read and checked,
// and its key on the workers (its name and the generation it was added
// in, so a name added again is another adapter to the slots and the
// prefix caches).
type served struct {
	info engine.AdapterInfo
	key  string
	load map[string]any // the open request's "load" object (PROTOCOL.md, "LoRA adapters")
}

// slotState is one device slot of one worker as the supervisor assigned
// it: the adapter key it holds ("" when none or unknown), the open
// sequences that run it, and when it was last opened (for LRU eviction).
type slotState struct {
	key     string
	users   int
	used    uint64
	pending chan struct{} // closed when a warm-up's load into the slot ends
}

// AddAdapter reads and checks the adapter at spec.Path against the model
// (internal/lora: every file problem is a *engine.CheckpointError, the
// weights are checked finite here, once) and serves it under spec.Name.
// Nothing goes to the workers until a sequence opens with it. See
// engine.AdapterModel.
func (m *Model) AddAdapter(ctx context.Context, spec engine.AdapterSpec) (engine.AdapterInfo, error) {
	if spec.Name == "" || spec.Path == "" {
		return engine.AdapterInfo{}, &engine.InvalidParamError{Param: "adapter", Reason: "AdapterSpec needs a Name and a Path"}
	}
	if err := m.usable(); err != nil {
		return engine.AdapterInfo{}, err
	}
	a, err := lora.Read(spec.Path)
	if err != nil {
		return engine.AdapterInfo{}, err
	}
	base, err := lora.ReadBase(m.spec.Path)
	if err != nil {
		return engine.AdapterInfo{}, err
	}
	if err := a.Check(base, m.maxRank()); err != nil {
		return engine.AdapterInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return engine.AdapterInfo{}, err
	}
	if err := a.CheckFinite(); err != nil {
		return engine.AdapterInfo{}, err
	}
	if m.info.AdapterSlots == 0 {
		return engine.AdapterInfo{}, &engine.InvalidParamError{Param: "adapter",
			Reason: fmt.Sprintf("model %q serves no adapters here (the torch backend serves them on decoders)", m.spec.ID)}
	}
	info := a.Info(spec.Name, 2)
	info.Bytes = m.slotBytes // resident, an adapter takes a whole slot of the highest rank
	load, err := loadObject(a)
	if err != nil {
		return engine.AdapterInfo{}, err
	}
	info.Pinned = spec.Pinned
	m.amu.Lock()
	defer m.amu.Unlock()
	pinned := 0
	for name, s := range m.adapters {
		if s.info.Pinned && name != spec.Name {
			pinned++
		}
	}
	if err := engine.CheckPin(spec, m.info.AdapterSlots, pinned); err != nil {
		return engine.AdapterInfo{}, err
	}
	m.agen++
	if _, ok := m.adapters[spec.Name]; ok {
		m.gone.Add(1) // the old one's saved KV: EvictedSaved drops it
	}
	m.adapters[spec.Name] = &served{info: info, key: spec.Name + "#" + strconv.FormatUint(m.agen, 10), load: load}
	return info, nil
}

// loadObject is the open request's "load" object for adapter a: its
// file, rank, scale and pairs (PROTOCOL.md, "LoRA adapters").
func loadObject(a *lora.Adapter) (map[string]any, error) {
	pairs := make([][]any, len(a.Pairs))
	for i, p := range a.Pairs {
		pairs[i] = []any{p.Layer, p.Module, p.A, p.B, p.Transposed}
	}
	file := "adapter_model.safetensors"
	if a.Format == lora.FormatMLX {
		file = "adapters.safetensors"
	}
	abs, err := filepath.Abs(filepath.Join(a.Dir, file))
	if err != nil {
		return nil, &engine.CheckpointError{Path: a.Dir, Reason: err.Error()}
	}
	return map[string]any{"file": abs, "rank": a.Rank, "scale": a.Scale, "pairs": pairs}, nil
}

// RemoveAdapter stops serving name; see engine.AdapterModel. Its slots
// on the workers become the first to reuse once its sequences are freed.
func (m *Model) RemoveAdapter(name string) error {
	m.amu.Lock()
	defer m.amu.Unlock()
	if _, ok := m.adapters[name]; !ok {
		return fmt.Errorf("%w: adapter %q is not served by model %q", engine.ErrModelNotFound, name, m.spec.ID)
	}
	delete(m.adapters, name)
	m.gone.Add(1)
	return nil
}

// dropGoneSaved drops the KV saved by sequences of adapters removed or
// replaced (nothing can reuse it) and reports the keys as evicted. It
// looks only when an adapter went since it last looked. Serialised with
// Open, Step and Free.
func (m *Model) dropGoneSaved() {
	g := m.gone.Load()
	if m.swept.Load() == g {
		return
	}
	m.swept.Store(g)
	for key, akey := range m.savedBy {
		if !m.isServed(akey) {
			m.DropSaved(key)
			m.evicted = append(m.evicted, key)
		}
	}
}

// isServed reports whether akey is the key of an adapter served now.
// isPinned reports whether slot key akey holds an adapter served now
// and pinned (never evicted).
func (m *Model) isPinned(akey string) bool {
	if akey == "" {
		return false
	}
	m.amu.RLock()
	defer m.amu.RUnlock()
	cur := m.adapters[akey[:strings.LastIndexByte(akey, '#')]]
	return cur != nil && cur.key == akey && cur.info.Pinned
}

func (m *Model) isServed(akey string) bool {
	m.amu.RLock()
	defer m.amu.RUnlock()
	cur := m.adapters[akey[:strings.LastIndexByte(akey, '#')]]
	return cur != nil && cur.key == akey
}

// Adapters lists the adapters served, by name.
func (m *Model) Adapters() []engine.AdapterInfo {
	m.amu.RLock()
	defer m.amu.RUnlock()
	out := make([]engine.AdapterInfo, 0, len(m.adapters))
	for _, s := range m.adapters {
		out = append(out, s.info)
	}
	slices.SortFunc(out, func(a, b engine.AdapterInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// OpenAdapter opens a sequence that runs with adapter (empty: Open). It
// is routed as Open routes it, except that without saved KV to follow it
// prefers a worker holding the adapter (within Open's load bound, with
// the blocks for the prompt), and
// that when every slot of the chosen worker holds an adapter open
// sequences run, it goes to the least loaded worker with one to spare.
// There the adapter takes a slot: the one that holds it already, else an
// empty one, else the least recently opened one no open sequence uses,
// the open request carrying what to load. Each worker has its own slots;
// a replacement worker starts with the pinned adapters alone
// (adapterwarm.go). ErrOutOfMemory means every
// worker's slots are in use. See engine.AdapterModel.
func (m *Model) OpenAdapter(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey, adapter string) (int, error) {
	if adapter == "" {
		return m.Open(ctx, id, prompt, prefixKey)
	}
	if err := m.usable(); err != nil {
		return 0, err
	}
	m.amu.RLock()
	a := m.adapters[adapter]
	m.amu.RUnlock()
	if a == nil {
		return 0, fmt.Errorf("%w: adapter %q is not served by model %q", engine.ErrModelNotFound, adapter, m.spec.ID)
	}
	if m.info.Encoder {
		return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q is an encoder: it embeds (OpenPooled) and does not generate", m.spec.ID)}
	}
	return m.openWith(ctx, id, prompt, prefixKey, engine.PoolNone, a)
}

// errSlotsBusy is OpenAdapter's error when every slot of the worker holds
// an adapter open sequences run.
var errSlotsBusy = errors.New("every adapter slot holds an adapter open sequences run or a pinned one")

// claim picks p's slot for adapter a: its own, an empty one, one whose
// adapter was removed or replaced, else the least recently opened unused
// one whose adapter is not pinned. load says the worker must load it
// there. It changes nothing until the open succeeds (hold). m.smu is
// held.
func (m *Model) claim(p *proc, a *served) (slot int, load bool, err error) {
	st := m.slotsOf(p)
	best := -1
	for i, s := range st {
		if s.key == a.key {
			return i, false, nil
		}
		if s.users > 0 || s.pending != nil || m.isPinned(s.key) {
			continue
		}
		if best < 0 || m.evictBefore(s, st[best]) {
			best = i
		}
	}
	if best < 0 {
		return 0, false, fmt.Errorf("%w: %w (%d on worker %d; retry after some finish)", engine.ErrOutOfMemory, errSlotsBusy, len(st), p.slot)
	}
	return best, true, nil
}

// route is the worker a new sequence of n prompt tokens goes to, as
// pickFor picks it; a sequence of adapter a without saved KV to follow
// goes, within the bound of affinityLoad, to the least loaded worker
// that holds a resident (no load, and no other worker's slot taken) and
// has the blocks for the prompt (roomFor).
func (m *Model) route(key string, a *served, n int) (*slot, func(error)) {
	if _, saved := m.saved[key]; a == nil || (key != "" && saved) {
		return m.pickFor(key, n)
	}
	total := int64(1)
	var best *slot
	for _, s := range m.e.slots {
		total += s.open.Load()
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		if p == nil || !p.alive() || !m.holds(p, a) || !m.roomFor(p, n) {
			continue
		}
		if best == nil || s.open.Load() < best.open.Load() {
			best = s
		}
	}
	if best != nil && best.open.Load()+1 <= int64(math.Ceil(affinityLoad*float64(total)/float64(len(m.e.slots)))) {
		if done, err := best.breaker.Allow(); err == nil {
			return best, done
		}
	}
	return m.pickSlot(n)
}

// warming is the pending chan of p's slot that a warm-up is loading a
// into; nil when none. m.smu is held.
func (m *Model) warming(p *proc, a *served) chan struct{} {
	for _, s := range m.slotsOf(p) {
		if s.key == a.key && s.pending != nil {
			return s.pending
		}
	}
	return nil
}

// holds reports whether p's slots hold a, as the supervisor assigned them.
func (m *Model) holds(p *proc, a *served) bool {
	m.smu.Lock()
	defer m.smu.Unlock()
	return slices.ContainsFunc(m.resident[p], func(x slotState) bool { return x.key == a.key })
}

// slotFor is another live worker than busy with a slot for adapter a,
// the least loaded whose breaker admits a sequence, with the admission's
// done func; nil when every worker's slots are in use. m.smu is held.
func (m *Model) slotFor(busy *proc, a *served) (*slot, *proc, func(error)) {
	order := slices.Clone(m.e.slots)
	slices.SortStableFunc(order, func(x, y *slot) int { return cmp.Compare(x.open.Load(), y.open.Load()) })
	for _, s := range order {
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		if p == nil || p == busy || !p.alive() {
			continue
		}
		if _, _, err := m.claim(p, a); err != nil {
			continue
		}
		if done, err := s.breaker.Allow(); err == nil {
			return s, p, done
		}
	}
	return nil, nil, nil
}

// evictBefore orders unused slots for eviction: empty ones, then those
// whose adapter is no longer served, then the least recently opened.
func (m *Model) evictBefore(a, b slotState) bool {
	ra, rb := m.evictRank(a), m.evictRank(b)
	if ra != rb {
		return ra < rb
	}
	return a.used < b.used
}

func (m *Model) evictRank(s slotState) int {
	switch {
	case s.key == "":
		return 0
	case !m.isServed(s.key):
		return 1
	}
	return 2
}

// slotsOf is p's slot table, made empty for a worker seen the first time
// (a replacement's holds the pinned adapters warmPinned loaded, set
// before it serves); tables of dead workers are dropped. m.smu is held.
func (m *Model) slotsOf(p *proc) []slotState {
	st, ok := m.resident[p]
	if !ok {
		for q := range m.resident {
			if !q.alive() {
				delete(m.resident, q)
			}
		}
		st = make([]slotState, m.info.AdapterSlots)
		m.resident[p] = st
	}
	return st
}

// adapterField is the open request's "adapter" object for a in slot.
func adapterField(a *served, slot int, load bool) map[string]any {
	f := map[string]any{"name": a.key, "slot": slot}
	if load {
		f["load"] = a.load
	}
	return f
}

// hold records the outcome of an open with a in p's slot: on success the
// slot holds it and counts the sequence; see place. m.smu is held.
func (m *Model) hold(p *proc, a *served, slot int, load bool, err error) {
	if m.place(p, a, slot, load, err) {
		m.slotsOf(p)[slot].users++
	}
}

// place records the outcome of a request that used or loaded a in p's
// slot, and reports whether the slot holds a now: on success it does,
// used now; after a failed load nobody knows what the slot holds. m.smu
// is held.
func (m *Model) place(p *proc, a *served, slot int, load bool, err error) bool {
	st := m.slotsOf(p)
	if st[slot].pending != nil {
		close(st[slot].pending)
		st[slot].pending = nil
	}
	if err != nil {
		if load {
			st[slot] = slotState{}
		}
		return false
	}
	m.atick++
	st[slot].key, st[slot].used = a.key, m.atick
	return true
}

// release drops a freed sequence from its adapter slot.
func (m *Model) release(ref seqRef) {
	if ref.adapter == 0 {
		return
	}
	m.smu.Lock()
	defer m.smu.Unlock()
	if st, ok := m.resident[ref.proc]; ok && st[ref.adapter-1].users > 0 {
		st[ref.adapter-1].users--
	}
}

// maxRank is the highest adapter rank the model takes.
func (m *Model) maxRank() int {
	if m.spec.MaxAdapterRank > 0 {
		return m.spec.MaxAdapterRank
	}
	return engine.DefaultMaxAdapterRank
}

// adapterSlots is the slot count the model asks the workers for.
func (m *Model) adapterSlots() int {
	if m.spec.AdapterSlots > 0 {
		return m.spec.AdapterSlots
	}
	return engine.DefaultAdapterSlots
}

// adapterInfo fills the model's adapter fields from the workers' load
// replies: slots only when every worker serves adapters.
func (m *Model) adapterInfo(infos []*wireInfo) {
	for _, w := range infos {
		if w.AdapterSlots == 0 {
			return
		}
	}
	// A tensor-parallel worker reports one rank's bytes: every rank holds
	// its share of each slot.
	m.info.AdapterSlots, m.info.MaxAdapterRank = infos[0].AdapterSlots, infos[0].MaxAdapterRank
	m.slotBytes = infos[0].AdapterSlotBytes * int64(max(1, infos[0].TP))
	for _, w := range infos { // every worker holds slots of its own
		m.info.AdapterBytes += w.AdapterBytes * int64(max(1, w.TP))
	}
}
