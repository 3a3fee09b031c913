package engine

import (
	"context"
	"fmt"
)

// AdapterSpec names a LoRA adapter to serve over a loaded model.
type AdapterSpec struct {
	// Name is the id requests use for the adapter. Required.
	Name string
	// Path is the adapter directory: PEFT's adapter_config.json and
	// adapter_model.safetensors, or mlx-lm's adapter_config.json and
	// adapters.safetensors. Required.
	Path string
	// Pinned keeps the adapter in its device slot once it is resident: the
	// slots never evict it for another adapter (removing the name, or
	// adding it again unpinned, lets it go). A model pins at most
	// AdapterSlots-1 adapters, so one slot always serves the others;
	// AddAdapter refuses more (CheckPin).
	Pinned bool
}

// AdapterInfo describes an adapter a model serves.
type AdapterInfo struct {
	// Name is the id requests use.
	Name string
	// Path is the directory it was read from.
	Path string
	// Format is "peft" or "mlx" (mlx-lm's layout).
	Format string
	// Rank is the adapter's r.
	Rank int
	// Scale multiplies B·A: lora_alpha/r, lora_alpha/sqrt(r) under rsLoRA
	// (PEFT's use_rslora), or mlx-lm's scale as written.
	Scale float64
	// Targets are the projections it changes, in the checkpoint's module
	// names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
	// down_proj; qkv_proj and gate_up_proj for fused families).
	Targets []string
	// Layers is the number of decoder layers it changes.
	Layers int
	// Bytes is the device memory the adapter takes while it is resident.
	Bytes int64
	// Pinned is AdapterSpec.Pinned.
	Pinned bool
}

// CheckPin is AddAdapter's check of spec.Pinned for a model of slots
// adapter slots that pins pinned adapters now, not counting one already
// served under spec.Name (which the new one replaces): an
// *InvalidParamError when pinning it would leave no slot for the other
// adapters.
func CheckPin(spec AdapterSpec, slots, pinned int) error {
	if spec.Pinned && pinned+1 > slots-1 {
		return &InvalidParamError{Param: "pinned", Reason: fmt.Sprintf(
			"adapter %q: %d of %d adapter slots are pinned; one must stay for the others (raise ModelSpec.AdapterSlots)",
			spec.Name, pinned, slots)}
	}
	return nil
}

// AdapterModel is implemented by models that serve LoRA adapters over
// their weights: each adapter adds scale·B·A to the projections it
// targets for the sequences opened with it, and sequences of different
// adapters and of the base run in the same Step.
//
// AddAdapter, RemoveAdapter and Adapters are safe for concurrent use with
// every other method: they read and check files and keep a registry, and
// take no device memory. OpenAdapter is serialised with Open, Step and Free
// like them: it makes the adapter resident in one of Info().AdapterSlots
// device slots when it is not (reading it from disk: the first sequence of
// an adapter that was never resident, or was evicted, pays the load), and
// evicts the least recently used adapter that no open sequence uses and is
// not pinned (AdapterSpec.Pinned) when the slots are full.
type AdapterModel interface {
	// AddAdapter reads the adapter at spec.Path, checks it against the
	// model and serves it under spec.Name. Adding a name again replaces
	// the adapter for sequences opened later.
	//
	// Errors: a *CheckpointError for an adapter that does not fit the
	// model — missing or corrupt files, a rank above Info().MaxAdapterRank,
	// a target module the model does not have or cannot adapt, tensor
	// shapes that do not match the model's, a weight that is not finite —
	// and an *InvalidParamError for an empty name or path or one pin too
	// many (CheckPin); ErrClosed.
	AddAdapter(ctx context.Context, spec AdapterSpec) (AdapterInfo, error)

	// RemoveAdapter stops serving name: later OpenAdapter calls fail, and
	// its device slot is given back once the sequences opened with it are
	// freed. An unknown name returns an error wrapping ErrModelNotFound.
	RemoveAdapter(name string) error

	// Adapters lists the adapters served, by name.
	Adapters() []AdapterInfo

	// OpenAdapter is Open for a sequence that runs with adapter (empty:
	// the base model). KV is never shared between adapters: a prefix
	// saved or cached by a sequence of one adapter (or of the base) is
	// reused only by sequences of the same one.
	//
	// Errors: as Open's, an error wrapping ErrModelNotFound for an
	// adapter not served, and ErrOutOfMemory when every slot holds an
	// adapter that open sequences use or that is pinned (retry after
	// some finish).
	OpenAdapter(ctx context.Context, id SeqID, prompt []int32, prefixKey, adapter string) (reused int, err error)
}

// AdapterWarmer is implemented by adapter models that can make an adapter
// resident ahead of its requests, where OpenAdapter would otherwise load
// it on first use: on an engine of several workers, each of which keeps
// slots of its own, on every live worker. WarmAdapter opens no sequence
// and takes a slot as OpenAdapter does (the one holding the adapter
// already, else an empty one, else the least recently used one no open
// sequence uses and not pinned). A model that implements it also makes
// its pinned adapters (AdapterSpec.Pinned) resident again where it lost
// them for reasons of its own, such as a worker that replaces a lost one.
//
// Unlike Open, Step and Free, WarmAdapter is safe to call while the model
// serves: the engine orders it with them (an open of the adapter where it
// is still loading waits for that load, within the open's ctx). Errors: an error wrapping
// ErrModelNotFound for an adapter not served, ErrOutOfMemory when every
// slot of a worker holds an adapter open sequences use or a pinned one,
// a *CheckpointError when the files changed since AddAdapter read them,
// ErrClosed, ctx's error. A failure on some workers leaves the adapter
// resident on the others and served everywhere (it loads with its first
// sequence where it is not resident).
//
// The serving layer warms a pinned adapter with it as the adapter is
// added and when its base loads again.
type AdapterWarmer interface {
	WarmAdapter(ctx context.Context, name string) error
}

// DefaultAdapterSlots and DefaultMaxAdapterRank are what a model that
// serves adapters takes when ModelSpec leaves AdapterSlots and
// MaxAdapterRank zero.
const (
	DefaultAdapterSlots   = 8
	DefaultMaxAdapterRank = 64
)
