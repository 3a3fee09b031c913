package prewarm

import (
	"fmt"
	"time"
)

// Phase is where one model stands in a PreWarmer.
type Phase int

// Pre-warming phases, in the order a model goes through them.
const (
	// Pending: waiting for its turn.
	Pending Phase = iota
	// Loading: the checkpoint is being loaded.
	Loading
	// Warming: loaded; the engine's warm-up and the warm-up generations run.
	Warming
	// Ready: loaded and warm.
	Ready
	// Failed: the load or the warm-up failed (Err says why) and nothing
	// of the model stays loaded; the other models go on.
	Failed
	// Aborted: Stop or the Start context ended first; nothing of the model
	// stays loaded.
	Aborted
)

var phaseNames = [...]string{"pending", "loading", "warming", "ready", "failed", "aborted"}

func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return fmt.Sprintf("Phase(%d)", int(p))
	}
	return phaseNames[p]
}

// Settled reports whether the phase is final: Ready, Failed or Aborted.
func (p Phase) Settled() bool { return p >= Ready }

// ModelProgress is one model's pre-warming, as Status reports it.
type ModelProgress struct {
	ID       string
	Priority int
	Phase    Phase
	// Err says why the model failed or was aborted.
	Err error
	// Attempts counts warm-up attempts: more than one after a worker was
	// lost during warm-up and the engine restarted it.
	Attempts int
	// LoadTime and WarmTime are how long loading and warming took (so
	// far, while in that phase).
	LoadTime, WarmTime time.Duration
	// Warm is what the warm-up did.
	Warm WarmReport
	// Started is when loading began; Finished when the model settled.
	Started, Finished time.Time
}

// Status is a snapshot of a PreWarmer.
type Status struct {
	// Models in pre-warming order (priority, then the order given).
	Models []ModelProgress
	// Settled counts the models that are ready, failed or aborted.
	Settled int
	// Ready reports whether the readiness policy is met.
	Ready bool
}

// Progress is the fraction of models settled, from 0 to 1.
func (s Status) Progress() float64 {
	if len(s.Models) == 0 {
		return 1
	}
	return float64(s.Settled) / float64(len(s.Models))
}

// WarmReport is what warming one model did.
type WarmReport struct {
	// BatchSizes are the batch-size buckets the engine warmed (none when
	// its models do not implement engine.Warmer).
	BatchSizes []int
	// Generations is the number of warm-up generations run, Tokens the
	// tokens they generated.
	Generations, Tokens int
}

// Policy says when a PreWarmer counts as ready.
type Policy struct {
	all         bool
	minPriority int
}

// WhenComplete is ready once every model is ready.
func WhenComplete() Policy { return Policy{all: true} }

// WhileWarming is ready once every model of priority minPriority or above
// is ready, while the others may still load and warm.
func WhileWarming(minPriority int) Policy { return Policy{minPriority: minPriority} }

func (p Policy) covers(priority int) bool { return p.all || priority >= p.minPriority }

func (p Policy) String() string {
	if p.all {
		return "when complete"
	}
	return fmt.Sprintf("while warming, priority >= %d", p.minPriority)
}
