package openai

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/toolcall"
)

// Handler serves a Server over the OpenAI HTTP API (see the package doc for
// the endpoints, fields and extensions). It is safe for concurrent use.
type Handler struct {
	srv     balancer.Backend
	cfg     config
	metrics *httpMetrics
	created int64 // the models' "created" time
}

// New returns a Handler over srv: a *mlxserving.Server, or a
// balancer.LoadBalancer in front of several instances (anything that
// implements balancer.Backend).
func New(srv balancer.Backend, opts ...Option) (*Handler, error) {
	if srv == nil || (reflect.ValueOf(srv).Kind() == reflect.Pointer && reflect.ValueOf(srv).IsNil()) {
		return nil, errors.New("openai: server is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("openai: %w", err)
		}
	}
	m, err := newHTTPMetrics(cfg.meterProvider)
	if err != nil {
		return nil, fmt.Errorf("openai: metrics: %w", err)
	}
	h := &Handler{srv: srv, cfg: cfg, metrics: m, created: time.Now().Unix()}
	if h.cfg.ready == nil {
		h.cfg.ready = h.modelsLoaded
	}
	return h, nil
}

// route is one endpoint: its method and handler.
type route struct {
	name    string
	method  string
	handler func(*Handler, http.ResponseWriter, *http.Request)
	access  access // who may call it when the handler has API keys
}

var routes = map[string]route{
	"/v1/chat/completions": {"chat_completions", http.MethodPost, (*Handler).chatCompletions, accessKey},
	"/v1/completions":      {"completions", http.MethodPost, (*Handler).completions, accessKey},
	"/v1/models":           {"models", http.MethodGet, (*Handler).models, accessKey},
	"/v1/embeddings":       {"embeddings", http.MethodPost, (*Handler).embeddings, accessKey},
	// vLLM's run-time LoRA endpoints.
	"/v1/load_lora_adapter":   {"load_lora_adapter", http.MethodPost, (*Handler).loadAdapter, accessAdmin},
	"/v1/unload_lora_adapter": {"unload_lora_adapter", http.MethodPost, (*Handler).unloadAdapter, accessAdmin},
	"/health":                 {"health", http.MethodGet, (*Handler).health, accessOpen},
	"/ready":                  {"ready", http.MethodGet, (*Handler).readyz, accessOpen},
	"/metrics":                {"metrics", http.MethodGet, (*Handler).metricsz, accessAdmin},
	"/debug/trace":            {"trace", http.MethodPost, (*Handler).tracez, accessAdmin},
}

// ServeHTTP routes r to its endpoint.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	rt, ok := routes[path]
	if !ok && strings.HasPrefix(path, "/v1/models/") {
		rt, ok = route{"model", http.MethodGet, (*Handler).model, accessKey}, true
	}
	rec := &statusRecorder{ResponseWriter: w}
	start := time.Now()
	defer func() { h.metrics.record(r.Context(), rt.name, rec.status, time.Since(start)) }()
	switch {
	case !ok:
		rt.name = "unknown"
		writeError(rec, newAPIError(http.StatusNotFound, typeNotFound, "", "unknown_url", fmt.Sprintf("no endpoint %s %s", r.Method, path)))
	case r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead):
		rec.Header().Set("Allow", rt.method)
		writeError(rec, newAPIError(http.StatusMethodNotAllowed, typeInvalidRequest, "", "method_not_allowed",
			fmt.Sprintf("%s takes %s, not %s", path, rt.method, r.Method)))
	default:
		r, err := h.checkAccess(rec, r, rt.access)
		if err != nil {
			writeError(rec, err)
			return
		}
		rt.handler(h, rec, r)
	}
}

func (h *Handler) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (h *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	if err := h.cfg.ready(r.Context()); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (h *Handler) modelsLoaded(context.Context) error {
	if len(h.modelStatus()) == 0 {
		return errors.New("no model loaded or registered")
	}
	return nil
}

func (h *Handler) metricsz(w http.ResponseWriter, r *http.Request) {
	if h.cfg.metricsHandler == nil {
		writeError(w, newAPIError(http.StatusNotFound, typeNotFound, "", "unknown_url", "metrics are not served here"))
		return
	}
	h.cfg.metricsHandler.ServeHTTP(w, r)
}

func (h *Handler) tracez(w http.ResponseWriter, r *http.Request) {
	if h.cfg.traceHandler == nil {
		writeError(w, newAPIError(http.StatusNotFound, typeNotFound, "", "unknown_url", "device traces are not served here"))
		return
	}
	h.cfg.traceHandler.ServeHTTP(w, r)
}

func (h *Handler) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := h.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	cr, err := req.chat(r, h.cfg.defaultMax)
	if err != nil {
		writeError(w, err)
		return
	}
	charge, err := authorize(r.Context(), cr.Model, &cr.Params, req.namesTier(r))
	if err != nil {
		writeError(w, err)
		return
	}
	explicit := req.MaxTokens != nil || req.MaxCompletionTokens != nil
	id := "chatcmpl-" + rand.Text()
	created := time.Now().Unix()
	sts, err := h.startN(r.Context(), req.choices(), &cr.Params, func(ctx context.Context, _ int) (*api.Stream, error) {
		return h.start(ctx, explicit, func(ctx context.Context, maxTokens int) (*api.Stream, error) {
			cr.MaxTokens = maxTokens
			return h.srv.Chat(ctx, cr)
		}, cr.MaxTokens)
	})
	if err != nil {
		writeError(w, err)
		return
	}
	fs := make([]*format, len(sts))
	for i, st := range sts {
		fs[i] = newFormat(true, id, created, cr.Model, req.Logprobs, req.includeUsage())
		fs[i].index, fs[i].tokenIDs = i, req.ReturnTokenIDs
		hd := st.Header()
		if req.tools {
			fs[i].tools = newToolStream(toolcall.Format(hd.ToolFormat), hd.ToolForced)
		}
		if hd.Reasoning && req.separateReasoning() {
			fs[i].reasoning = toolcall.NewReasoningParser(hd.ReasoningOpen)
		}
	}
	defer charge(fs)
	if len(sts) == 1 {
		h.respond(w, r, sts[0], fs[0], req.Stream)
		return
	}
	h.respondN(w, r, sts, fs, req.Stream)
}

func (h *Handler) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := h.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	gr, err := req.completion(r, h.cfg.defaultMax)
	if err != nil {
		writeError(w, err)
		return
	}
	charge, err := authorize(r.Context(), gr.Model, &gr.Params, req.namesTier(r))
	if err != nil {
		writeError(w, err)
		return
	}
	id := "cmpl-" + rand.Text()
	created := time.Now().Unix()
	sts, err := h.startN(r.Context(), req.choices(), &gr.Params, func(ctx context.Context, _ int) (*api.Stream, error) {
		return h.start(ctx, req.MaxTokens != nil, func(ctx context.Context, maxTokens int) (*api.Stream, error) {
			gr.MaxTokens = maxTokens
			return h.srv.Generate(ctx, gr)
		}, gr.MaxTokens)
	})
	if err != nil {
		writeError(w, err)
		return
	}
	fs := make([]*format, len(sts))
	for i := range sts {
		fs[i] = newFormat(false, id, created, gr.Model, req.Logprobs != nil, req.includeUsage())
		fs[i].index, fs[i].tokenIDs = i, req.ReturnTokenIDs
	}
	defer charge(fs)
	if len(sts) == 1 {
		h.respond(w, r, sts[0], fs[0], req.Stream)
		return
	}
	h.respondN(w, r, sts, fs, req.Stream)
}

// namesTier reports whether the request asked for a tier.
func (c *commonFields) namesTier(r *http.Request) bool {
	return c.Priority != "" || r.Header.Get("X-Priority") != ""
}

func (c *commonFields) includeUsage() bool {
	return c.Stream && c.StreamOptions != nil && c.StreamOptions.IncludeUsage
}

func (h *Handler) decode(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := readBody(w, r, h.cfg.maxBody)
	if err != nil {
		return err
	}
	return decodeStrict(body, v)
}

// start submits a request. When the client gave no max_tokens and the
// default does not fit the context, it retries once with the room left.
func (h *Handler) start(ctx context.Context, explicit bool, submit func(context.Context, int) (*api.Stream, error), maxTokens int) (*api.Stream, error) {
	st, err := submit(ctx, maxTokens)
	if err == nil || explicit {
		return st, err
	}
	var (
		cl *engine.ContextLengthError
		kv *scheduler.CapacityError
	)
	switch {
	case errors.As(err, &cl) && cl.MaxNew > 0 && cl.Limit > cl.Prompt:
		return h.start(ctx, explicit, submit, cl.Limit-cl.Prompt)
	case errors.As(err, &kv) && kv.Capacity > kv.Prompt && kv.MaxNew > kv.Capacity-kv.Prompt:
		return submit(ctx, kv.Capacity-kv.Prompt)
	}
	return st, err
}

// respond sends the stream as SSE or as one body.
func (h *Handler) respond(w http.ResponseWriter, r *http.Request, st *api.Stream, f *format, stream bool) {
	defer st.Close()
	if id := st.Header().Session; id != "" {
		w.Header().Set("X-Session-ID", id)
	}
	if c := st.Header().Cache; c != "" {
		w.Header().Set("X-Cache", c) // request merging: hit, miss or merged
	}
	var err error
	if stream {
		err = h.streamSSE(w, st, f)
	} else {
		err = h.writeWhole(w, st, f)
	}
	if err != nil && r.Context().Err() == nil {
		h.cfg.logger.Warn("request failed", "path", r.URL.Path, "model", f.model, "id", f.id, "err", err)
	}
	if u := f.usage; err == nil && u != nil && u.Resumes > 0 {
		h.cfg.logger.Info("request resumed", "path", r.URL.Path, "model", f.model, "id", f.id,
			"resumes", u.Resumes, "resume_gap", u.ResumeGap, "backend", finishedBy(st, u))
	}
}

// writeWhole collects the stream into one response body.
func (h *Handler) writeWhole(w http.ResponseWriter, st *api.Stream, f *format) error {
	body, _, err := f.collect(st)
	if err != nil {
		writeError(w, err)
		return err
	}
	writeJSON(w, http.StatusOK, body)
	return nil
}
