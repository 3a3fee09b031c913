package mlxserving

import (
	"slices"

	"github.com/mlxserving/mlxserving/balancer"
)

// Server is a backend a balancer.LoadBalancer can route to.
var _ balancer.Backend = (*Server)(nil)

// Load reports the Server's load across its models: requests queued,
// sequences running, the fraction of KV capacity reserved, and the models
// it serves — those loaded and those known to its model manager, which
// load on demand. It is what a balancer.LoadBalancer routes on.
func (s *Server) Load() balancer.Load {
	var l balancer.Load
	reserved, capacity := 0, 0
	s.mu.RLock()
	for id, m := range s.models {
		if m == nil {
			continue
		}
		l.Models = append(l.Models, id)
		bs := m.batcher.Stats()
		queued, _ := m.queue.Len()
		l.Waiting += queued
		l.Running += bs.Running
		l.MaxBatch += m.info.MaxBatch
		reserved += bs.KVReserved
		capacity += bs.KVCapacity
	}
	s.mu.RUnlock()
	for _, st := range s.mgr.Status() {
		if !slices.Contains(l.Models, st.ID) {
			l.Models = append(l.Models, st.ID)
		}
	}
	for _, a := range s.Adapters() { // routed like models: to the instances that serve them
		if slices.Contains(l.Models, a.Base) {
			l.Models = append(l.Models, a.Name)
		}
	}
	slices.Sort(l.Models)
	if capacity > 0 {
		l.KVUsage = float64(reserved) / float64(capacity)
	}
	return l
}
