package mlxserving_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/session"
)

// A New that fails part way ends what it built before the failure (the
// session registry's sweeper, the merger), whichever part failed.
func TestNewFailureEndsWhatItBuilt(t *testing.T) {
	sim, err := enginetest.NewSim()
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	for _, c := range []struct {
		name string
		opts []mlxserving.Option
	}{
		{"session options", []mlxserving.Option{mlxserving.WithMerging(), mlxserving.WithSessionOptions(session.WithTTL(-1))}},
		{"manager options", []mlxserving.Option{mlxserving.WithMerging(), mlxserving.WithManagerOptions(prewarm.WithBudget(-1))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			running := goleak.IgnoreCurrent()
			srv, err := mlxserving.New(sim, c.opts...)
			if err == nil {
				srv.Close()
				t.Fatal("New accepted a bad option")
			}
			goleak.VerifyNone(t, running)
		})
	}
}
