package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leaves a goroutine behind
// (the nvidia-smi samplers' readers, the serving helpers).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
