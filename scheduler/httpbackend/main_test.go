package httpbackend_test

import (
	"testing"

	"go.uber.org/goleak"
)

// expiryGoroutine is golang-lru/v2 expirable's expiry loop, started by the
// upstream's response cache (merge.WithCache) and never stopped by that
// library (see the root package's TestMain).
const expiryGoroutine = "github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(expiryGoroutine)) }
