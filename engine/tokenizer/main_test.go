package tokenizer

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves goroutines behind (the template
// engine must not start any that outlive a render).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
