package natstest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Cluster is n embedded nats-servers routed to each other on loopback, as
// a NATS cluster of separate machines would be. A test kills one with
// Stop and checks the clients given every URL carry on.
type Cluster struct {
	nodes []*server.Server
	urls  []string
}

// StartCluster runs n routed nats-servers on loopback ports and waits
// until every node has a route to every other. They are shut down by
// tb.Cleanup.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if n < 2 {
		tb.Fatalf("natstest: a cluster of %d nodes", n)
	}
	c := &Cluster{}
	tb.Cleanup(func() {
		for i := range c.nodes {
			c.Stop(i)
		}
	})
	var seed *url.URL
	for i := range n {
		opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, ServerName: fmt.Sprintf("node-%d", i),
			Cluster: server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: -1, PoolSize: -1}}
		if seed != nil {
			opts.Routes = []*url.URL{seed}
		}
		ns, err := server.NewServer(opts)
		if err != nil {
			tb.Fatal(err)
		}
		go ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			tb.Fatal("natstest: nats-server not ready")
		}
		c.nodes = append(c.nodes, ns)
		c.urls = append(c.urls, "nats://"+ns.Addr().(*net.TCPAddr).String())
		if seed == nil {
			seed = &url.URL{Scheme: "nats", Host: ns.ClusterAddr().String()}
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		routed := true
		for _, ns := range c.nodes {
			routed = routed && ns.NumRoutes() == n-1
		}
		if routed {
			return c
		}
		if time.Now().After(deadline) {
			tb.Fatal("natstest: the cluster's routes did not form")
		}
	}
}

// URL returns node i's client URL.
func (c *Cluster) URL(i int) string { return c.urls[i] }

// URLs returns every node's client URL, node first first, comma-separated
// as nats.Connect takes them.
func (c *Cluster) URLs(first int) string {
	urls := append([]string{c.urls[first]}, c.urls[:first]...)
	return strings.Join(append(urls, c.urls[first+1:]...), ",")
}

// Stop shuts node i down; its clients move to the other nodes.
func (c *Cluster) Stop(i int) {
	if ns := c.nodes[i]; ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		c.nodes[i] = nil
	}
}
