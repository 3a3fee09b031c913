package mlxserving

import (
	"fmt"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

// TestOutcomeFollowsClass: the metrics outcome of a request's error is
// its retry.Classify outcome, so it agrees with the HTTP status. Budget
// and load errors (503) and unknown models (404) were once counted as
// "invalid" requests.
func TestOutcomeFollowsClass(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{&prewarm.BudgetError{Model: "m", Retry: time.Second}, "rejected"},
		{&prewarm.LoadError{Model: "m", Err: &engine.CheckpointError{Path: "x", Reason: "y"}}, "unavailable"},
		{&ModelNotFoundError{Model: "m"}, "not_found"},
		{&scheduler.QueueFullError{}, "rejected"},
		{ErrServerClosed, "unavailable"},
		{&engine.InvalidParamError{Param: "top_p", Reason: "x"}, "invalid"},
		{&retry.DeadlineError{Kind: retry.Stall}, "deadline"},
		{fmt.Errorf("read: %w", api.ErrAbandoned), "cancelled"},
		{fmt.Errorf("step: %w", engine.ErrWorkerLost), "unavailable"},
	} {
		if got := outcome(tc.err); got != tc.want {
			t.Errorf("%v: outcome %q, want %q", tc.err, got, tc.want)
		}
	}
}
