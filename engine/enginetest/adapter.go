package enginetest

import (
	"context"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lora"
)

var _ engine.AdapterWarmer = (*simModel)(nil)

// The simulated models serve LoRA adapters (engine.AdapterModel): an
// adapter is read and checked with the engines' own reader (its files must
// be a valid PEFT or mlx-lm adapter of at most MaxAdapterRank; no base
// shapes are checked, the sim having none), and a sequence opened with one
// starts its rolling hash from the adapter's name, so its tokens differ
// from the base's and every other adapter's and are still a pure function
// of the adapter and the history. Slots are counted as a real engine
// counts them: OpenAdapter makes an adapter resident, evicting the least
// recently used one no open sequence uses, and fails with ErrOutOfMemory
// when every slot is in use; Stats count the loads. WarmAdapter makes an
// adapter resident without a sequence.

// simAdapter is a served adapter and its slot state.
type simAdapter struct {
	info     engine.AdapterInfo
	start    uint64 // the hash its sequences start from
	resident bool
	users    int    // open sequences using it
	used     uint64 // the last OpenAdapter that used it, for LRU eviction
	removed  bool   // RemoveAdapter ran: no new sequences; slot freed with the last user
}

// AddAdapter reads and checks the adapter at spec.Path; see
// [engine.AdapterModel].
func (m *simModel) AddAdapter(ctx context.Context, spec engine.AdapterSpec) (engine.AdapterInfo, error) {
	if spec.Name == "" || spec.Path == "" {
		return engine.AdapterInfo{}, &engine.InvalidParamError{Param: "adapter", Reason: "an adapter needs a name and a path"}
	}
	if err := ctx.Err(); err != nil {
		return engine.AdapterInfo{}, err
	}
	a, err := lora.Read(spec.Path)
	if err != nil {
		return engine.AdapterInfo{}, err
	}
	if a.Rank > m.info.MaxAdapterRank {
		return engine.AdapterInfo{}, &engine.CheckpointError{Path: spec.Path,
			Reason: fmt.Sprintf("rank %d is above the highest this model takes (%d; raise ModelSpec.MaxAdapterRank)", a.Rank, m.info.MaxAdapterRank)}
	}
	if err := a.CheckFinite(); err != nil {
		return engine.AdapterInfo{}, err
	}
	h := fnv.New64a()
	h.Write([]byte(spec.Name))
	ad := &simAdapter{info: a.Info(spec.Name, 2), start: feed(hashStart^h.Sum64(), nil)}
	ad.info.Pinned = spec.Pinned
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return engine.AdapterInfo{}, fmt.Errorf("enginetest: model %q: add adapter: %w", m.info.ID, engine.ErrClosed)
	}
	pinned := 0
	for name, a := range m.adapters {
		if a.info.Pinned && name != spec.Name {
			pinned++
		}
	}
	if err := engine.CheckPin(spec, m.info.AdapterSlots, pinned); err != nil {
		return engine.AdapterInfo{}, err
	}
	if old := m.adapters[spec.Name]; old != nil {
		m.retire(old)
	}
	m.adapters[spec.Name] = ad
	return ad.info, nil
}

// RemoveAdapter stops serving name; see [engine.AdapterModel].
func (m *simModel) RemoveAdapter(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ad := m.adapters[name]
	if ad == nil || m.closed {
		return fmt.Errorf("enginetest: model %q: adapter %q: %w", m.info.ID, name, engine.ErrModelNotFound)
	}
	delete(m.adapters, name)
	m.retire(ad)
	return nil
}

// retire stops a removed or replaced adapter from opening sequences;
// its slot is given back once its last sequence is freed.
func (m *simModel) retire(ad *simAdapter) {
	ad.removed = true
	m.giveBack(ad)
}

// giveBack frees a retired adapter's slot when no sequence uses it.
func (m *simModel) giveBack(ad *simAdapter) {
	if ad.removed && ad.users == 0 && ad.resident {
		ad.resident = false
		m.resident--
	}
}

// Adapters lists the adapters served, by name.
func (m *simModel) Adapters() []engine.AdapterInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]engine.AdapterInfo, 0, len(m.adapters))
	for _, a := range m.adapters {
		out = append(out, a.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// OpenAdapter is Open for a sequence of adapter (empty: the base).
func (m *simModel) OpenAdapter(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey, adapter string) (int, error) {
	if adapter == "" {
		return m.Open(ctx, id, prompt, prefixKey)
	}
	if m.info.Encoder {
		return m.Open(ctx, id, prompt, prefixKey)
	}
	m.mu.Lock()
	ad := m.adapters[adapter]
	if ad == nil {
		m.mu.Unlock()
		return 0, fmt.Errorf("enginetest: model %q: adapter %q: %w", m.info.ID, adapter, engine.ErrModelNotFound)
	}
	if err := m.use(ad); err != nil {
		m.mu.Unlock()
		return 0, err
	}
	ad.users++ // held while open runs, so no other Open evicts it
	m.mu.Unlock()
	reused, err := m.open(ctx, id, prompt, savedKey(adapter, prefixKey), false)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		ad.users--
		return 0, err
	}
	seq := m.seqs[id]
	seq.adapter = ad
	seq.hash = feed(ad.start, seq.tokens)
	return reused, nil
}

// WarmAdapter makes adapter name resident as OpenAdapter does, opening no
// sequence; see [engine.AdapterWarmer]. The sim has one set of slots and
// loses none, so it has nothing to warm again later.
func (m *simModel) WarmAdapter(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("enginetest: model %q: warm adapter: %w", m.info.ID, engine.ErrClosed)
	}
	ad := m.adapters[name]
	if ad == nil {
		return fmt.Errorf("enginetest: model %q: adapter %q: %w", m.info.ID, name, engine.ErrModelNotFound)
	}
	if err := m.use(ad); err != nil {
		return err
	}
	m.sim.stats.adapterWarms.Add(1)
	return nil
}

// use makes ad resident, loading it (Stats count the load) when it is not,
// and marks it used now. m.mu is held.
func (m *simModel) use(ad *simAdapter) error {
	if !ad.resident {
		if err := m.makeResident(); err != nil {
			return err
		}
		ad.resident = true
		m.resident++
		m.sim.stats.adapterLoads.Add(1)
	}
	m.adapterClock++
	ad.used = m.adapterClock
	return nil
}

// makeResident frees a slot for one more adapter when every slot is
// taken: the least recently used adapter no open sequence uses and not
// pinned leaves.
func (m *simModel) makeResident() error {
	if m.resident < m.info.AdapterSlots {
		return nil
	}
	var victim *simAdapter
	for _, a := range m.adapters {
		if a.resident && a.users == 0 && !a.info.Pinned && (victim == nil || a.used < victim.used) {
			victim = a
		}
	}
	if victim == nil {
		return fmt.Errorf("enginetest: model %q: all %d adapter slots are in use by open sequences or pinned: %w",
			m.info.ID, m.info.AdapterSlots, engine.ErrOutOfMemory)
	}
	victim.resident = false
	m.resident--
	return nil
}

// release drops a freed sequence's hold on its adapter. m.mu is held.
func (m *simModel) release(seq *simSeq) {
	ad := seq.adapter
	if ad == nil {
		return
	}
	ad.users--
	m.giveBack(ad)
}

// savedKey is where a sequence of adapter keeps KV saved under key: the
// base's and each adapter's saves never meet.
func savedKey(adapter, key string) string {
	if adapter == "" || key == "" {
		return key
	}
	return adapter + adapterKeySep + key
}

// adapterKeySep joins an adapter's name to a save key; no name holds it.
const adapterKeySep = "\x00"

// callerKey is the key the caller saved under, from savedKey's.
func callerKey(k string) string {
	if i := strings.Index(k, adapterKeySep); i >= 0 {
		return k[i+len(adapterKeySep):]
	}
	return k
}
