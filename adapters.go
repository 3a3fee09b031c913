package mlxserving

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
)

// AdapterSpec names a LoRA adapter to serve over a model the Server knows.
type AdapterSpec struct {
	// Name is the model id requests use for the adapter. It must not be
	// the id of a model or of another adapter.
	Name string
	// Path is the adapter directory, as PEFT or mlx-lm save it.
	Path string
	// Base is the id of the model the adapter was trained on; empty takes
	// the one model the Server knows (an error when it knows several).
	Base string
	// Pinned pre-warms the adapter as it loads and keeps it in its
	// engine's device slot: other adapters never evict it
	// (engine.AdapterSpec.Pinned). An engine that warms adapters
	// (engine.AdapterWarmer: pyproc) makes it resident on every worker,
	// again when its base loads again, and on a worker that replaces a
	// lost one; then one short generation at background priority runs its
	// first steps (on one worker), which alone makes it resident on an
	// engine that does not warm adapters. A base pins at most its adapter
	// slots less one; a pin past that is an *engine.InvalidParamError.
	Pinned bool
}

// AdapterStatus is an adapter the Server serves.
type AdapterStatus struct {
	engine.AdapterInfo
	// Base is the model it adapts.
	Base string
}

// adapterEntry is a served adapter: what LoadAdapter was given and what
// the engine said of it.
type adapterEntry struct {
	spec AdapterSpec
	info engine.AdapterInfo
	rev  string // what merged and cached responses key on: name, path and load
}

// ErrNoAdapters is returned when a model's engine serves no LoRA
// adapters.
var ErrNoAdapters = errors.New("the model's engine serves no LoRA adapters")

// LoadAdapter serves the LoRA adapter at spec.Path under spec.Name, over
// the model spec.Base, which is loaded first when it is only registered.
// Requests then name the adapter as their model (Request.Model): they run
// on the base model's batcher, batched with the base's and other
// adapters' requests, and their prefix cache, sessions and merged or
// cached responses are the adapter's own. The adapter comes back by itself
// when its base is evicted and loaded again.
//
// Errors: an *engine.CheckpointError for an adapter that does not fit the
// base (rank, shapes, target modules, non-finite weights, missing files),
// a *ModelNotFoundError for an unknown base, ErrModelExists when the name
// is taken, ErrNoAdapters when the base's engine serves none, a
// *prewarm.BudgetError when the base's adapter slots (Info.AdapterBytes,
// charged once a base serves adapters, and at its later loads) do not fit
// the memory budget, and an *engine.InvalidParamError for an empty name
// or path.
func (s *Server) LoadAdapter(ctx context.Context, spec AdapterSpec) (AdapterStatus, error) {
	if spec.Name == "" || spec.Path == "" {
		return AdapterStatus{}, &engine.InvalidParamError{Param: "adapter", Reason: "an adapter needs a name and a path"}
	}
	if spec.Base == "" {
		ids := s.knownIDs()
		if len(ids) != 1 {
			return AdapterStatus{}, &engine.InvalidParamError{Param: "base_model",
				Reason: fmt.Sprintf("name the base model of adapter %q: the server knows %v", spec.Name, ids)}
		}
		spec.Base = ids[0]
	}
	isModel := s.mgr.Known(spec.Name) // every model, loaded or not, is the manager's
	s.mu.Lock()
	if _, isAdapter := s.adapters[spec.Name]; isAdapter || isModel {
		s.mu.Unlock()
		return AdapterStatus{}, fmt.Errorf("%w: %q", ErrModelExists, spec.Name)
	}
	s.adapters[spec.Name] = nil // reserved while it loads
	s.mu.Unlock()
	info, err := s.addAdapter(ctx, spec)
	s.mu.Lock()
	if err != nil {
		delete(s.adapters, spec.Name)
		s.mu.Unlock()
		return AdapterStatus{}, err
	}
	s.adapters[spec.Name] = &adapterEntry{spec: spec, info: info,
		rev: fmt.Sprintf("%s\x00%s\x00%d", spec.Name, spec.Path, s.loads.Add(1))}
	s.mu.Unlock()
	if spec.Pinned {
		s.warmAdapter(ctx, spec)
	}
	return AdapterStatus{AdapterInfo: info, Base: spec.Base}, nil
}

// warmAdapter pre-warms a pinned adapter, so its first request pays no
// load, and pinned it stays: the engine's own warm-up where its model
// implements engine.AdapterWarmer (resident on every worker), then one
// short generation at background priority (its first steps, on one
// worker; resident there on an engine without the warm-up). A failure
// (every slot in use, a worker lost, the server closing) is logged: the
// adapter is served all the same and loads with its first request where
// it is not resident.
func (s *Server) warmAdapter(ctx context.Context, spec AdapterSpec) {
	m, err := s.acquire(ctx, spec.Base, nil)
	if err != nil {
		s.logAdapterCold(spec.Name, err)
		return
	}
	if w, ok := m.engine.(engine.AdapterWarmer); ok {
		if err := w.WarmAdapter(ctx, spec.Name); err != nil {
			s.logAdapterCold(spec.Name, err)
		}
	}
	s.release(m)
	if err := s.generateWarm(ctx, spec.Name); err != nil {
		s.logAdapterCold(spec.Name, err)
	}
}

// generateWarm runs one short generation of adapter at background
// priority, as a warm-up.
func (s *Server) generateWarm(ctx context.Context, adapter string) error {
	r := api.Request{Model: adapter, PromptTokens: []int32{1, 2, 3},
		Params: api.Params{MaxTokens: warmTokens, IgnoreEOS: true, Priority: api.Background}}
	st, err := s.Generate(context.WithValue(ctx, warmUpKey{}, true), r)
	if err == nil {
		_, err = st.Collect()
	}
	return err
}

// logAdapterCold logs a pinned adapter's warm-up that failed.
func (s *Server) logAdapterCold(name string, err error) {
	s.cfg.logger.Warn("pinned adapter not warmed; it loads with its first request", "adapter", name, "err", err)
}

// addAdapter adds spec to its base model's engine, loading the base.
func (s *Server) addAdapter(ctx context.Context, spec AdapterSpec) (engine.AdapterInfo, error) {
	m, err := s.acquire(ctx, spec.Base, nil)
	if err != nil {
		return engine.AdapterInfo{}, err
	}
	defer s.release(m)
	am, ok := m.engine.(engine.AdapterModel)
	if !ok || m.info.AdapterSlots <= 0 {
		return engine.AdapterInfo{}, fmt.Errorf("%w: model %q (engine %s)", ErrNoAdapters, spec.Base, m.info.Engine)
	}
	info, err := am.AddAdapter(ctx, engine.AdapterSpec{Name: spec.Name, Path: spec.Path, Pinned: spec.Pinned})
	if err != nil {
		return engine.AdapterInfo{}, fmt.Errorf("adapter %q over %q: %w", spec.Name, spec.Base, err)
	}
	// The slots the engine allocates for the first adapter count in the
	// memory budget from now on, and at every later load of the base.
	if err := s.mgr.Reserve(ctx, spec.Base, m.info.AdapterBytes); err != nil {
		_ = am.RemoveAdapter(spec.Name)
		return engine.AdapterInfo{}, fmt.Errorf("adapter %q over %q: its slots (%d bytes): %w", spec.Name, spec.Base, m.info.AdapterBytes, s.managerErr(spec.Base, err))
	}
	return info, nil
}

// UnloadAdapter stops serving an adapter: later requests for it fail
// with a *ModelNotFoundError; those already running finish.
func (s *Server) UnloadAdapter(_ context.Context, name string) error {
	s.mu.Lock()
	e := s.adapters[name]
	if e == nil {
		s.mu.Unlock()
		return &ModelNotFoundError{Model: name, Loaded: s.idsLocked()}
	}
	delete(s.adapters, name)
	m := s.models[e.spec.Base]
	last := true
	for _, o := range s.adapters {
		last = last && (o == nil || o.spec.Base != e.spec.Base)
	}
	s.mu.Unlock()
	if last { // the base's next load allocates no slots
		_ = s.mgr.Reserve(context.Background(), e.spec.Base, 0)
	}
	if m != nil {
		if am, ok := m.engine.(engine.AdapterModel); ok {
			if err := am.RemoveAdapter(name); err != nil && !errors.Is(err, engine.ErrModelNotFound) && !errors.Is(err, engine.ErrClosed) {
				return err
			}
		}
	}
	return nil
}

// Adapters lists the adapters served, by name.
func (s *Server) Adapters() []AdapterStatus {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]AdapterStatus, 0, len(s.adapters))
	for _, e := range s.adapters {
		if e != nil {
			out = append(out, AdapterStatus{AdapterInfo: e.info, Base: e.spec.Base})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// resolveAdapter maps a request's model to the model that runs it and the
// adapter it runs with: an adapter's name gives its base and itself; a
// model id with an explicit adapter must be that adapter's base.
func (s *Server) resolveAdapter(id, adapter string) (string, string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if e := s.adapters[id]; e != nil {
		if adapter != "" && adapter != id {
			return "", "", &engine.InvalidParamError{Param: "adapter", Reason: fmt.Sprintf("model %q is itself an adapter; adapter %q cannot run over it", id, adapter)}
		}
		return e.spec.Base, id, nil
	}
	if adapter == "" {
		return id, "", nil
	}
	e := s.adapters[adapter]
	if e == nil {
		return "", "", &ModelNotFoundError{Model: adapter, Loaded: s.idsLocked()}
	}
	if e.spec.Base != id {
		return "", "", &engine.InvalidParamError{Param: "adapter", Reason: fmt.Sprintf("adapter %q adapts %q, not %q", adapter, e.spec.Base, id)}
	}
	return id, adapter, nil
}

// restoreAdapters adds the adapters served over a model to its engine
// model after a (re)load, and warms the pinned ones where the engine
// warms adapters (before the model serves: an engine without it loads
// them with their first requests). An adapter that no longer loads (its
// files changed or went) stops being served; the error is logged.
func (s *Server) restoreAdapters(ctx context.Context, id string, em engine.Model) {
	s.mu.RLock()
	var specs []AdapterSpec
	for _, e := range s.adapters {
		if e != nil && e.spec.Base == id {
			specs = append(specs, e.spec)
		}
	}
	s.mu.RUnlock()
	am, ok := em.(engine.AdapterModel)
	w, warms := em.(engine.AdapterWarmer)
	for _, spec := range specs {
		var err error = ErrNoAdapters
		if ok {
			_, err = am.AddAdapter(context.Background(), engine.AdapterSpec{Name: spec.Name, Path: spec.Path, Pinned: spec.Pinned})
		}
		if err == nil && spec.Pinned && warms {
			// Within the load's ctx: its timeout, and Close or Unload, end
			// the warm-ups too (the adapter is served all the same).
			if werr := w.WarmAdapter(ctx, spec.Name); werr != nil {
				s.logAdapterCold(spec.Name, werr)
			}
		}
		if err != nil {
			s.cfg.logger.Error("adapter not restored after its base model loaded again; no longer served",
				"adapter", spec.Name, "base", id, "err", err)
			s.mu.Lock()
			delete(s.adapters, spec.Name)
			s.mu.Unlock()
		}
	}
}

// forgetAdapters stops serving the adapters over a model that is
// forgotten (UnloadModel of a model LoadModel added).
func (s *Server) forgetAdapters(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, e := range s.adapters {
		if e != nil && e.spec.Base == id {
			delete(s.adapters, name)
		}
	}
}

// adapterRev is what merged and cached responses of adapter key on; ""
// for the base.
func (s *Server) adapterRev(adapter string) string {
	if adapter == "" {
		return ""
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if e := s.adapters[adapter]; e != nil {
		return e.rev
	}
	return adapter
}

// knownIDs lists the models the Server knows, loaded or registered (the
// manager's, sorted by id).
func (s *Server) knownIDs() []string {
	var ids []string
	for _, st := range s.mgr.Status() {
		ids = append(ids, st.ID)
	}
	return ids
}

// adapterStatus lists the adapters as models with a parent, in the state
// of their base; Pinned is the adapter's own (AdapterSpec.Pinned).
func (s *Server) adapterStatus(bases []prewarm.ModelStatus) []prewarm.ModelStatus {
	var out []prewarm.ModelStatus
	for _, a := range s.Adapters() {
		st := prewarm.ModelStatus{ID: a.Name, Parent: a.Base, State: prewarm.StateUnloaded, MemoryBytes: a.Bytes, Pinned: a.Pinned}
		for _, b := range bases {
			if b.ID == a.Base {
				st.State, st.Info, st.Busy = b.State, b.Info, b.Busy
			}
		}
		out = append(out, st)
	}
	return out
}
