package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/openai"
)

// statsPath is the admin JSON stats endpoint.
const statsPath = "/admin/stats"

// newMetrics builds a MeterProvider exporting to a registry of the
// gateway's own (never the global one) and the /metrics handler over it,
// as examples/server does.
func newMetrics() (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// registerNATSMetrics exports the gateway's NATS connection:
// mlxserving.gateway.nats.connected (1 while connected, else 0),
// mlxserving.gateway.nats.reconnects and mlxserving.gateway.instances
// (those discovery knows now).
func registerNATSMetrics(mp metric.MeterProvider, nc *nats.Conn, instances func() []string) (metric.Registration, error) {
	meter := mp.Meter("github.com/mlxserving/mlxserving/examples/gateway")
	connected, err1 := meter.Int64ObservableGauge("mlxserving.gateway.nats.connected",
		metric.WithDescription("1 while the gateway's NATS connection is up, 0 while it is down or reconnecting."))
	reconnects, err2 := meter.Int64ObservableCounter("mlxserving.gateway.nats.reconnects",
		metric.WithDescription("Times the gateway's NATS connection reconnected."))
	known, err3 := meter.Int64ObservableGauge("mlxserving.gateway.instances",
		metric.WithDescription("Instances discovery knows over NATS now."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		up := int64(0)
		if nc.Status() == nats.CONNECTED {
			up = 1
		}
		o.ObserveInt64(connected, up)
		o.ObserveInt64(reconnects, int64(nc.Stats().Reconnects))
		o.ObserveInt64(known, int64(len(instances())))
		return nil
	}, connected, reconnects, known)
}

// stats is the JSON the stats endpoint answers.
type stats struct {
	NATS     *natsStats     `json:"nats,omitempty"` // without -nats: absent
	Requests requestStats   `json:"requests"`
	Affinity affinityStats  `json:"affinity"`
	Backends []backendStats `json:"backends"`
}

type natsStats struct {
	Status     string   `json:"status"`
	URL        string   `json:"url,omitempty"`
	Reconnects uint64   `json:"reconnects"`
	Instances  []string `json:"instances"`
}

type requestStats struct {
	Routed      uint64 `json:"routed"`
	Failovers   uint64 `json:"failovers"`
	Refused     uint64 `json:"refused"`
	Interrupted uint64 `json:"interrupted"`
	Resumed     uint64 `json:"resumed"`
}

type affinityStats struct {
	Home    uint64 `json:"home"`
	Spilled uint64 `json:"spilled"`
	Moved   uint64 `json:"moved"`
}

type backendStats struct {
	Name      string       `json:"name"`
	Healthy   bool         `json:"healthy"`
	Draining  bool         `json:"draining"`
	Breaker   breakerStats `json:"breaker"`
	InFlight  int          `json:"in_flight"`
	Routed    uint64       `json:"routed"`
	Failovers uint64       `json:"failovers"`
	Resumes   uint64       `json:"resumes"`
	TTFTms    float64      `json:"ttft_ms"`
	Load      loadStats    `json:"load"`
}

type breakerStats struct {
	State               string `json:"state"`
	Requests            uint32 `json:"requests"`
	Failures            uint32 `json:"failures"`
	ConsecutiveFailures uint32 `json:"consecutive_failures"`
}

type loadStats struct {
	Models   []string   `json:"models"`
	Waiting  int        `json:"waiting"`
	Running  int        `json:"running"`
	KVUsage  float64    `json:"kv_usage"`
	MaxBatch int        `json:"max_batch"`
	Updated  *time.Time `json:"updated,omitempty"` // absent for a live local report
}

func statsOf(lb *balancer.LoadBalancer, nc *nats.Conn, instances func() []string) stats {
	st := lb.Stats()
	out := stats{
		Requests: requestStats{Routed: st.Routed, Failovers: st.Failovers, Refused: st.Refused, Interrupted: st.Interrupted, Resumed: st.Resumed},
		Affinity: affinityStats{Home: st.AffinityHome, Spilled: st.AffinitySpilled, Moved: st.AffinityMoved},
		Backends: []backendStats{},
	}
	if nc != nil {
		names := instances()
		slices.Sort(names)
		out.NATS = &natsStats{Status: nc.Status().String(), URL: nc.ConnectedUrlRedacted(), Reconnects: nc.Stats().Reconnects, Instances: names}
	}
	for _, b := range st.Backends {
		l := loadStats{Models: b.Load.Models, Waiting: b.Load.Waiting, Running: b.Load.Running, KVUsage: b.Load.KVUsage, MaxBatch: b.Load.MaxBatch}
		if !b.Load.Updated.IsZero() {
			l.Updated = &b.Load.Updated
		}
		out.Backends = append(out.Backends, backendStats{
			Name: b.Name, Healthy: b.Healthy, Draining: b.Draining || b.Load.Draining,
			Breaker: breakerStats{State: b.Breaker.State.String(), Requests: b.Breaker.Requests, Failures: b.Breaker.Failures,
				ConsecutiveFailures: b.Breaker.ConsecutiveFailures},
			InFlight: b.InFlight, Routed: b.Routed, Failovers: b.Failovers, Resumes: b.Resumes,
			TTFTms: float64(b.Latency.Microseconds()) / 1e3, Load: l,
		})
	}
	return out
}

// adminOnly lets through the requests that carry an admin key of keys
// (as "Authorization: Bearer <key>", compared by SHA-256 in constant
// time), as the OpenAI handler guards /metrics; without keys, everyone.
func adminOnly(keys []openai.Key, next http.Handler) http.Handler {
	if len(keys) == 0 {
		return next
	}
	type hashed struct {
		sum   [sha256.Size]byte
		admin bool
	}
	var known []hashed
	for _, k := range keys {
		h := hashed{sum: sha256.Sum256([]byte(k.Secret)), admin: k.Admin}
		if k.Secret == "" {
			b, _ := hex.DecodeString(strings.TrimSpace(k.SHA256)) // openai.WithAPIKeys checked it
			copy(h.sum[:], b)
		}
		known = append(known, h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		sum := sha256.Sum256([]byte(token))
		found, admin := false, false
		for _, k := range known {
			if subtle.ConstantTimeCompare(sum[:], k.sum[:]) == 1 {
				found, admin = true, k.admin
			}
		}
		switch {
		case !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || !found:
			w.Header().Set("WWW-Authenticate", `Bearer realm="mlxserving"`)
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "an admin API key is required: send it as \"Authorization: Bearer <key>\"")
		case !admin:
			writeError(w, http.StatusForbidden, "permission_error", "admin_required", r.URL.Path+" needs an admin key")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// statsHandler answers GET statsPath with the balancer's stats as JSON.
func statsHandler(lb *balancer.LoadBalancer, nc *nats.Conn, instances func() []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", statsPath+" takes GET")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(statsOf(lb, nc, instances))
	})
}

// writeError answers an OpenAI-style error object.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
}
