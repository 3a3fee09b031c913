package natsbackend

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// TestLegacyCodes: an error message of an instance of an earlier version,
// with the codes it sent then, reaches the client as the typed error it
// stood for, classified with retry's code.
func TestLegacyCodes(t *testing.T) {
	cases := []struct {
		msg, want string
		check     func(error) bool
	}{
		{`{"code":"invalid_param","message":"bad","param":"top_k","retryable":false}`, retry.CodeInvalidValue,
			func(err error) bool {
				var ip *engine.InvalidParamError
				return errors.As(err, &ip) && ip.Param == "top_k"
			}},
		{`{"code":"bad_request","message":"bad request","retryable":false}`, retry.CodeInvalidValue, nil},
		{`{"code":"context_length","message":"long","context":{"Prompt":9,"MaxNew":9,"Limit":10},"retryable":false}`,
			retry.CodeContextLength, func(err error) bool {
				var cl *engine.ContextLengthError
				return errors.As(err, &cl) && cl.Limit == 10
			}},
		{`{"code":"rate_limited","message":"slow down","retry_after":2000000000,"retryable":true}`, retry.CodeRateLimited,
			func(err error) bool { d, ok := retry.RetryAfter(err); return ok && d == 2*time.Second }},
		{`{"code":"deadline","message":"late","deadline":{"Kind":2,"Limit":1000000},"retryable":false}`, retry.CodeStallDeadline,
			func(err error) bool {
				var de *retry.DeadlineError
				return errors.As(err, &de) && de.Kind == retry.Stall && de.Limit == time.Millisecond
			}},
		{`{"code":"deadline","message":"late","retryable":false}`, retry.CodeTotalDeadline, nil},
		{`{"code":"interrupted","message":"cut","retryable":false}`, retry.CodeInterrupted, nil},
		{`{"code":"internal","message":"boom","retryable":false}`, retry.CodeInternal, nil},
		{`{"code":"queue_full","message":"full","retry_after":1000000000,"retryable":true}`, retry.CodeQueueFull, nil},
	}
	for _, c := range cases {
		var w wireError
		if err := json.Unmarshal([]byte(c.msg), &w); err != nil {
			t.Fatal(err)
		}
		err := fromWire("old", w)
		if got := retry.Classify(err).Code; got != c.want {
			t.Errorf("%s: classified %q, want %q", c.msg, got, c.want)
		}
		if c.check != nil && !c.check(err) {
			t.Errorf("%s: received as %v", c.msg, err)
		}
	}
}
