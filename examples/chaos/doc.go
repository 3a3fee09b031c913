// Package chaos holds the multi-process chaos test of a cluster: NATS
// server processes (natstest/natsnode), instances of examples/server on the
// simulated engine and an examples/gateway, each its own process, killed,
// stopped and restarted under streaming load through the gateway. It has
// no code of its own; see chaos_test.go and BENCHMARKS.md.
package chaos
