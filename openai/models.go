package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/prewarm"
)

// parseKeepAlive reads Ollama's keep_alive: a Go duration string ("5m",
// "1h30m", "-1s"), or a number of seconds as a JSON number or string. 0
// unloads the model as soon as it is idle, a negative value keeps it
// loaded. Absent or null gives nil: the model's own keep-alive.
func parseKeepAlive(raw json.RawMessage) (*time.Duration, error) {
	if isNull(raw) {
		return nil, nil
	}
	bad := func() (*time.Duration, error) {
		return nil, badRequest("keep_alive", "invalid_value",
			"keep_alive is %s: want a duration such as \"5m\" or a number of seconds (0 unloads when idle, negative keeps loaded)", raw)
	}
	var text string
	if bytes.HasPrefix(bytes.TrimSpace(raw), []byte(`"`)) {
		if err := json.Unmarshal(raw, &text); err != nil {
			return bad()
		}
	} else {
		text = string(bytes.TrimSpace(raw))
	}
	if d, err := time.ParseDuration(text); err == nil {
		return &d, nil
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	if err != nil || math.IsNaN(secs) || math.IsInf(secs, 0) || math.Abs(secs) > math.MaxInt64/float64(time.Second) {
		return bad()
	}
	d := time.Duration(secs * float64(time.Second))
	return &d, nil
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root and Parent, as vLLM reports them: a LoRA adapter's parent is
	// its base model (null for a model); root is the base.
	Root   string  `json:"root"`
	Parent *string `json:"parent"`
	// Rank and Targets describe a LoRA adapter when it is loaded.
	Rank    int      `json:"lora_rank,omitempty"`
	Targets []string `json:"lora_target_modules,omitempty"`
	// Extensions: what the engine reports and the model manager's state.
	Engine        string `json:"engine,omitempty"`
	ContextLength int    `json:"context_length,omitempty"`
	State         string `json:"state"`
	Pinned        bool   `json:"pinned"`
	MemoryBytes   int64  `json:"memory_bytes,omitempty"`
	// IdleUntil is when an idle model unloads (Unix seconds); absent when
	// it is busy, pinned, kept forever or not loaded.
	IdleUntil int64 `json:"idle_until,omitempty"`
	// Error and RetryAt describe a failed load.
	Error   string `json:"error,omitempty"`
	RetryAt int64  `json:"retry_at,omitempty"`
}

func (h *Handler) modelObject(st prewarm.ModelStatus) modelObject {
	o := modelObject{ID: st.ID, Object: "model", Created: h.created, OwnedBy: "mlxserving",
		Engine: st.Info.Engine, ContextLength: st.Info.ContextLength, State: st.State.String(),
		Pinned: st.Pinned, MemoryBytes: st.MemoryBytes, Root: st.ID}
	if st.Parent != "" {
		o.Root, o.Parent = st.Parent, &st.Parent
	}
	if !st.IdleUntil.IsZero() {
		o.IdleUntil = st.IdleUntil.Unix()
	}
	if st.Err != nil {
		o.Error, o.RetryAt = st.Err.Err.Error(), st.Err.RetryAt.Unix()
	}
	return o
}

func (h *Handler) models(w http.ResponseWriter, r *http.Request) {
	data := []modelObject{}
	for _, st := range h.modelStatus() {
		if mayUseModel(r.Context(), st.ID) { // with API keys: the key's models only
			data = append(data, h.modelObject(st))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (h *Handler) model(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	for _, st := range h.modelStatus() {
		if st.ID == id && mayUseModel(r.Context(), id) {
			writeJSON(w, http.StatusOK, h.modelObject(st))
			return
		}
	}
	writeError(w, &mlxserving.ModelNotFoundError{Model: id})
}

// modelStatus lists the models served: a Server's known models with their
// state, or, for another backend (a load balancer), the models its load
// report names, as loaded.
func (h *Handler) modelStatus() []prewarm.ModelStatus {
	if ms, ok := h.srv.(interface{ ModelStatus() []prewarm.ModelStatus }); ok {
		return ms.ModelStatus()
	}
	ids := h.srv.Load().Models
	out := make([]prewarm.ModelStatus, len(ids))
	for i, id := range ids {
		out[i] = prewarm.ModelStatus{ID: id, State: prewarm.StateLoaded}
	}
	return out
}
