package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// cluster is a NATS cluster of natsnode processes, instances of
// examples/server on the simulated engine and one examples/gateway, every
// one its own process on loopback.
type cluster struct {
	tb        testing.TB
	bin       string
	nodeURLs  []string
	nats      []*proc
	instances map[string]*proc
	instArgs  []string
	gw        *proc
	gwURL     string
}

// startTimeout bounds every process's start on a loaded machine.
const startTimeout = 60 * time.Second

// newCluster starts nodes NATS nodes on ports of their own choosing, each
// routed to the first (which tells them of each other).
func newCluster(tb testing.TB, bin string, nodes int, instArgs ...string) *cluster {
	c := &cluster{tb: tb, bin: bin, instances: map[string]*proc{}, instArgs: instArgs}
	var seed string
	for i := range nodes {
		args := []string{"-addr", "127.0.0.1:-1", "-name", fmt.Sprintf("node-%d", i)}
		if nodes > 1 {
			args = append(args, "-cluster", "127.0.0.1:-1")
			if seed != "" {
				args = append(args, "-routes", seed)
			}
		}
		p := start(tb, fmt.Sprintf("nats-%d", i), bin+"/natsnode", args...)
		ready := strings.Fields(p.waitLine(tb, time.Time{}, startTimeout, "ready").text)
		c.nats = append(c.nats, p)
		c.nodeURLs = append(c.nodeURLs, ready[1])
		if seed == "" && len(ready) == 4 {
			seed = ready[3]
		}
	}
	return c
}

// natsURLs lists every node's client URL, node first first.
func (c *cluster) natsURLs(first int) string {
	var urls []string
	for k := range c.nodeURLs {
		urls = append(urls, c.nodeURLs[(first+k)%len(c.nodeURLs)])
	}
	return strings.Join(urls, ",")
}

// startInstance starts an instance named name, connected first to NATS
// node node, and waits until it joined the cluster.
func (c *cluster) startInstance(name string, node int) *proc {
	args := append([]string{"-addr", "127.0.0.1:0", "-engine", "sim", "-sim-step", "10ms",
		"-nats", c.natsURLs(node), "-instance", name}, c.instArgs...)
	p := start(c.tb, name, c.bin+"/server", args...)
	p.waitLine(c.tb, time.Time{}, startTimeout, "joined the cluster")
	c.instances[name] = p
	return p
}

// startGateway starts the gateway, connected first to NATS node 0, and
// waits until it listens.
func (c *cluster) startGateway(args ...string) {
	c.gw = start(c.tb, "gateway", c.bin+"/gateway", append([]string{"-addr", "127.0.0.1:0", "-nats", c.natsURLs(0)}, args...)...)
	l := c.gw.waitLine(c.tb, time.Time{}, startTimeout, "gateway listening")
	c.gwURL = "http://" + field(l.text, "addr")
}

// waitFound waits until the gateway found instance name after since.
func (c *cluster) waitFound(name string, since time.Time) time.Time {
	return c.gw.waitLine(c.tb, since, startTimeout, "discovery: instance found", "instance="+name).at
}
