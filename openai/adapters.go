package openai

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
)

// adapterServer is a backend that loads LoRA adapters at run time: a
// Server. A load balancer over several instances does not; each instance
// loads its own, and the balancer routes to those that serve them.
type adapterServer interface {
	LoadAdapter(ctx context.Context, spec mlxserving.AdapterSpec) (mlxserving.AdapterStatus, error)
	UnloadAdapter(ctx context.Context, name string) error
}

// loadAdapterRequest is POST /v1/load_lora_adapter's body, vLLM's fields
// and the base model (needed when the server knows several models).
type loadAdapterRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
	Base string `json:"base_model_name"`
	// LoadInPlace is vLLM's flag to replace an adapter of the same name;
	// here unload it first.
	LoadInPlace bool `json:"load_inplace"`
	// Pinned keeps the adapter in its device slot once resident
	// (mlxserving.AdapterSpec.Pinned); not a vLLM field.
	Pinned bool `json:"pinned"`
}

type unloadAdapterRequest struct {
	Name string `json:"lora_name"`
	// ID is vLLM's lora_int_id, which names nothing here: refused when set
	// alone.
	ID *int `json:"lora_int_id"`
}

func (h *Handler) adapters() (adapterServer, error) {
	as, ok := h.srv.(adapterServer)
	if !ok {
		return nil, newAPIError(http.StatusNotFound, typeNotFound, "", "unknown_url",
			"this server routes to instances that load their own adapters: load the adapter on each instance")
	}
	return as, nil
}

// loadAdapter is POST /v1/load_lora_adapter (admin keys): it serves the
// adapter at lora_path as model lora_name and answers with its model
// object (parent: the base).
func (h *Handler) loadAdapter(w http.ResponseWriter, r *http.Request) {
	as, err := h.adapters()
	if err != nil {
		writeError(w, err)
		return
	}
	var req loadAdapterRequest
	if err := h.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case req.Name == "":
		writeError(w, badRequest("lora_name", "missing_required_parameter", "lora_name is required"))
		return
	case req.Path == "":
		writeError(w, badRequest("lora_path", "missing_required_parameter", "lora_path is required"))
		return
	case req.LoadInPlace:
		writeError(w, badRequest("load_inplace", "unsupported_parameter", "load_inplace is not supported: unload %q first", req.Name))
		return
	}
	st, err := as.LoadAdapter(r.Context(), mlxserving.AdapterSpec{Name: req.Name, Path: req.Path, Base: req.Base, Pinned: req.Pinned})
	if err != nil {
		writeError(w, adapterRefusal(err))
		return
	}
	o := h.modelObject(adapterModelStatus(st))
	o.Rank, o.Targets = st.Rank, st.Targets
	writeJSON(w, http.StatusOK, o)
}

// unloadAdapter is POST /v1/unload_lora_adapter (admin keys).
func (h *Handler) unloadAdapter(w http.ResponseWriter, r *http.Request) {
	as, err := h.adapters()
	if err != nil {
		writeError(w, err)
		return
	}
	var req unloadAdapterRequest
	if err := h.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Name == "" {
		reason := "lora_name is required"
		if req.ID != nil {
			reason = "lora_int_id names no adapter here: give lora_name"
		}
		writeError(w, badRequest("lora_name", "missing_required_parameter", "%s", reason))
		return
	}
	if err := as.UnloadAdapter(r.Context(), req.Name); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": req.Name, "object": "model", "deleted": true,
		"message": fmt.Sprintf("adapter %q unloaded", req.Name)})
}

// adapterRefusal makes what is wrong with the adapter asked for a 400
// naming the field: its files (a CheckpointError), its name (taken), or a
// base that serves no adapters. Other errors keep their class.
func adapterRefusal(err error) error {
	var ce *engine.CheckpointError
	switch {
	case errors.As(err, &ce):
		return &engine.InvalidParamError{Param: "lora_path", Reason: err.Error(), Err: err}
	case errors.Is(err, mlxserving.ErrModelExists):
		return &engine.InvalidParamError{Param: "lora_name", Reason: err.Error(), Err: err}
	case errors.Is(err, mlxserving.ErrNoAdapters):
		return &engine.InvalidParamError{Param: "base_model_name", Reason: err.Error(), Err: err}
	}
	return err
}

// adapterModelStatus is a just-loaded adapter as a model with a parent.
func adapterModelStatus(st mlxserving.AdapterStatus) prewarm.ModelStatus {
	return prewarm.ModelStatus{ID: st.Name, Parent: st.Base, State: prewarm.StateLoaded, MemoryBytes: st.Bytes, Pinned: st.Pinned}
}
