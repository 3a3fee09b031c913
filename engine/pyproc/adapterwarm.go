package pyproc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
)

// Warming adapters: each worker keeps adapter slots of its own, so an
// adapter a sequence made resident on one worker is loaded again by the
// first sequence of it on every other, and a replacement worker starts
// with none. WarmAdapter loads an adapter on every live worker ahead of
// its requests, and a replacement worker gets the pinned adapters before
// it serves. Both send the "adapter" request (PROTOCOL.md, "LoRA
// adapters"): the open request's adapter object, loaded into its slot
// without a sequence, so no KV, pool report or saved key is involved.

var _ engine.AdapterWarmer = (*Model)(nil)

// WarmAdapter makes adapter name resident on every worker, in the slot
// OpenAdapter would take there (see claim); a worker that holds it
// already loads nothing. The workers load at once. A worker being
// restarted is waited for, within ctx (its replacement gets the pinned
// adapters as it starts, this one too when it is pinned). Safe to call
// while the model serves: a sequence of this adapter opened meanwhile on a
// worker still loading it waits for that load; nothing else waits (the
// slot table is held only to pick the slots and record the outcomes). A
// failure on a worker (every slot in use or pinned there, files
// changed, the worker lost) is returned, naming the worker, after the
// others loaded; see engine.AdapterWarmer.
func (m *Model) WarmAdapter(ctx context.Context, name string) error {
	if err := m.usable(); err != nil {
		return err
	}
	m.amu.RLock()
	a := m.adapters[name]
	m.amu.RUnlock()
	if a == nil {
		return fmt.Errorf("%w: adapter %q is not served by model %q", engine.ErrModelNotFound, name, m.spec.ID)
	}
	procs := make([]*proc, len(m.e.slots))
	errs := make([]error, len(m.e.slots))
	for i, s := range m.e.slots {
		procs[i], errs[i] = s.current(ctx, m.e.closing)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.smu.Lock()
	if m.resident == nil {
		m.smu.Unlock()
		return engine.ErrClosed
	}
	loads := make([]*slotLoad, len(procs))
	for i, p := range procs {
		if errs[i] == nil {
			loads[i], errs[i] = m.sendLoad(p, a)
		}
	}
	m.smu.Unlock()
	for i, l := range loads {
		if l != nil {
			errs[i] = l.wait(ctx, m)
		}
	}
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("adapter %q on worker %d: %w", name, i, err)
		}
	}
	if err := errors.Join(errs...); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// slotLoad is an "adapter" request in flight: a going into p's slot.
type slotLoad struct {
	p    *proc
	a    *served
	slot int
	rid  uint64
	ch   chan *reply
}

// sendLoad claims p's slot for a and sends the request that loads it
// there; nil when p holds a already (then counted as just used, so that
// warming an adapter also keeps it from being the next one evicted).
// m.smu is held.
func (m *Model) sendLoad(p *proc, a *served) (*slotLoad, error) {
	slot, load, err := m.claim(p, a)
	if err != nil {
		return nil, err
	}
	if !load {
		m.atick++
		m.slotsOf(p)[slot].used = m.atick
		return nil, nil
	}
	l := &slotLoad{p: p, a: a, slot: slot}
	m.slotsOf(p)[slot] = slotState{key: a.key, pending: make(chan struct{})}
	l.rid, l.ch, err = p.send(request("adapter", map[string]any{"model": m.handle, "adapter": adapterField(a, slot, true)}), true)
	if err != nil {
		m.place(p, a, slot, true, err)
		return nil, err
	}
	return l, nil
}

// wait waits for the load's reply, m.smu not held (the slot is marked
// pending meanwhile: opens of the adapter on that worker wait for it,
// other adapters never take it), then records its outcome in the slot
// table under m.smu.
func (l *slotLoad) wait(ctx context.Context, m *Model) error {
	_, err := l.p.wait(ctx, m.spec.ID, l.rid, l.ch)
	m.smu.Lock()
	defer m.smu.Unlock()
	if m.resident != nil {
		m.place(l.p, l.a, l.slot, true, err)
	}
	return err
}

// warmPinned loads the pinned adapters onto p, a worker that replaces a
// lost one, after the model loaded there and before it serves: one slot
// each, in name order (they fit: a model pins at most AdapterSlots-1),
// recorded as p's slot table. A failure is logged; that adapter then
// loads with its first sequence on p. An error only when p died meanwhile
// (reload's caller then starts another).
func (m *Model) warmPinned(ctx context.Context, p *proc) error {
	pinned := m.pinned()
	if len(pinned) == 0 || m.closed.Load() {
		return nil
	}
	st := make([]slotState, m.info.AdapterSlots)
	for i, a := range pinned {
		if _, err := p.call(ctx, m.spec.ID, request("adapter", map[string]any{"model": m.handle, "adapter": adapterField(a, i, true)})); err != nil {
			if !p.alive() { // the replacement died too: the restart policy starts another
				return fmt.Errorf("warming pinned adapter %q: %w", a.info.Name, err)
			}
			m.e.cfg.logger.Warn("pinned adapter not loaded on the replacement worker; it loads with its first sequence there",
				"model", m.spec.ID, "adapter", a.info.Name, "worker", p.slot, "err", err)
			continue
		}
		st[i] = slotState{key: a.key}
	}
	m.smu.Lock()
	defer m.smu.Unlock()
	if m.resident != nil {
		m.resident[p] = st
	}
	return nil
}

// pinned lists the pinned adapters served, by name.
func (m *Model) pinned() []*served {
	m.amu.RLock()
	defer m.amu.RUnlock()
	var out []*served
	for _, a := range m.adapters {
		if a.info.Pinned {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(x, y *served) int { return strings.Compare(x.info.Name, y.info.Name) })
	return out
}
