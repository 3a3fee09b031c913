// Package natstest starts embedded nats-servers for tests: one on a random
// loopback port, optionally with a configuration file (users and
// permissions, as natsbackend's testdata/nats-server.conf), or a routed
// cluster of several (StartCluster); stopped when the test ends.
package natstest

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs a nats-server with the configuration file config ("" for
// none) on a loopback port and returns its client URL. The server is shut
// down by tb.Cleanup.
func Start(tb testing.TB, config string) string {
	tb.Helper()
	opts := &server.Options{}
	if config != "" {
		var err error
		if opts, err = server.ProcessConfigFile(config); err != nil {
			tb.Fatal(err)
		}
	}
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		tb.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats-server not ready")
	}
	tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return "nats://" + ns.Addr().(*net.TCPAddr).String()
}
