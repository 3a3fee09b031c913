package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
)

// replicas are the Servers of this process: one, or with -gpus cut into
// more than one replica of -tp GPUs, one Server per replica — its own
// engine, workers and batcher, so that the replicas step independently
// rather than in lockstep — behind an in-process LoadBalancer that routes
// each request by the prefixes the replicas hold and their load, as a
// gateway does across instances.
type replicas struct {
	engines []engine.Engine
	servers []*mlxserving.Server
	lb      *balancer.LoadBalancer // nil with one replica
}

// replicaCount is how many replicas the flags ask for: the -gpus given
// cut into groups of -tp (the Python engine places GPUs), else one.
func replicaCount(o options) int {
	if len(o.gpus) == 0 || (o.engine != "auto" && o.engine != "pyproc") {
		return 1
	}
	return max(1, len(o.gpus)/o.tp)
}

// openReplicas starts the engines and their Servers. On an error what
// was started is closed again.
func openReplicas(ctx context.Context, o options, dir string, log *slog.Logger, mp *sdkmetric.MeterProvider) (*replicas, error) {
	rs := &replicas{}
	if err := rs.open(ctx, o, dir, log, mp); err != nil {
		rs.close()
		return nil, err
	}
	return rs, nil
}

func (rs *replicas) open(ctx context.Context, o options, dir string, log *slog.Logger, mp *sdkmetric.MeterProvider) error {
	n := replicaCount(o)
	if n == 1 {
		eng, err := openEngine(ctx, o, dir, log)
		if err != nil {
			return err
		}
		rs.engines = append(rs.engines, eng)
		log.Info("engine started", "engine", eng.Name())
		srv, err := mlxserving.New(eng, serverOptions(o, log, mp)...)
		if err != nil {
			return err
		}
		rs.servers = append(rs.servers, srv)
		return nil
	}
	if len(o.gpus)%o.tp != 0 {
		return fmt.Errorf("-gpus %v: %d devices do not make replicas of -tp %d", o.gpus, len(o.gpus), o.tp)
	}
	lb, err := balancer.New(balancer.WithLogger(log), balancer.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	rs.lb = lb
	for r := range n {
		ro := o
		ro.gpus = o.gpus[r*o.tp : (r+1)*o.tp]
		rlog := log.With("replica", r)
		eng, err := openPyproc(ctx, ro, rlog)
		if err != nil {
			return fmt.Errorf("replica %d (GPUs %v): %w", r, ro.gpus, err)
		}
		rs.engines = append(rs.engines, eng)
		rlog.Info("engine started", "engine", eng.Name(), "gpus", ro.gpus)
		srv, err := mlxserving.New(eng, append(serverOptions(o, rlog, mp),
			mlxserving.WithMetricAttributes(attribute.String("replica", strconv.Itoa(r))))...)
		if err != nil {
			return err
		}
		rs.servers = append(rs.servers, srv)
		if err := rs.lb.Add("replica-"+strconv.Itoa(r), srv); err != nil {
			return err
		}
	}
	return nil
}

// front is what the HTTP API and the cluster serve: the Server, or the
// balancer over the replicas' Servers, which also loads and unloads
// adapters on every replica.
func (rs *replicas) front() balancer.Backend {
	if rs.lb == nil {
		return rs.servers[0]
	}
	return replicaFront{rs.lb, rs}
}

// replicaFront is the balancer over the replicas with the Server's
// adapter endpoints: an adapter is loaded on every replica, so that any
// of them can serve its requests.
type replicaFront struct {
	*balancer.LoadBalancer
	rs *replicas
}

// LoadAdapter loads the adapter on every replica (see
// replicas.loadAdapter) and has the balancer see it at once.
func (f replicaFront) LoadAdapter(ctx context.Context, spec mlxserving.AdapterSpec) (mlxserving.AdapterStatus, error) {
	st, err := f.rs.loadAdapter(ctx, spec)
	if err == nil {
		f.Refresh()
	}
	return st, err
}

// UnloadAdapter unloads the adapter from every replica.
func (f replicaFront) UnloadAdapter(ctx context.Context, name string) error {
	var errs []error
	for _, srv := range f.rs.servers {
		errs = append(errs, srv.UnloadAdapter(ctx, name))
	}
	f.Refresh()
	return errors.Join(errs...)
}

// refresh has the balancer read the replicas' models now: after they
// loaded the main model and the -lora adapters.
func (rs *replicas) refresh() {
	if rs.lb != nil {
		rs.lb.Refresh()
	}
}

// loadAdapter loads the adapter on every replica and reports the first's
// status; a replica that refuses it has the others unload it again.
func (rs *replicas) loadAdapter(ctx context.Context, spec mlxserving.AdapterSpec) (mlxserving.AdapterStatus, error) {
	var first mlxserving.AdapterStatus
	for i, srv := range rs.servers {
		st, err := srv.LoadAdapter(ctx, spec)
		if err != nil {
			for _, done := range rs.servers[:i] {
				_ = done.UnloadAdapter(context.WithoutCancel(ctx), spec.Name)
			}
			return mlxserving.AdapterStatus{}, err
		}
		if i == 0 {
			first = st
		}
	}
	return first, nil
}

// shutdown drains every replica's Server at once.
func (rs *replicas) shutdown(ctx context.Context) error {
	errs := make([]error, len(rs.servers))
	var wg sync.WaitGroup
	for i, srv := range rs.servers {
		wg.Go(func() { errs[i] = srv.Shutdown(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// close stops the balancer, the Servers and the engines.
func (rs *replicas) close() {
	if rs.lb != nil {
		_ = rs.lb.Close()
	}
	for _, srv := range rs.servers {
		_ = srv.Close()
	}
	for _, eng := range rs.engines {
		_ = eng.Close()
	}
}
