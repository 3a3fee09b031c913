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
	tb         testing.TB
	bin        string
	natsPorts  []int
	routePorts []int
	nats       []*proc
	instances  map[string]*proc
	instArgs   []string
	gw         *proc
	gwURL      string
}

// startTimeout bounds every process's start on a loaded machine.
const startTimeout = 60 * time.Second

func newCluster(tb testing.TB, bin string, nodes int, instArgs ...string) *cluster {
	c := &cluster{tb: tb, bin: bin, instances: map[string]*proc{}, instArgs: instArgs}
	for range nodes {
		c.natsPorts = append(c.natsPorts, freePort(tb))
		c.routePorts = append(c.routePorts, freePort(tb))
	}
	for i := range nodes {
		c.startNATS(i)
	}
	return c
}

// startNATS starts NATS node i, routed to the others when there are.
func (c *cluster) startNATS(i int) {
	args := []string{"-addr", fmt.Sprintf("127.0.0.1:%d", c.natsPorts[i]), "-name", fmt.Sprintf("node-%d", i)}
	if len(c.natsPorts) > 1 {
		var routes []string
		for j, p := range c.routePorts {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
			}
		}
		args = append(args, "-cluster", fmt.Sprintf("127.0.0.1:%d", c.routePorts[i]), "-routes", strings.Join(routes, ","))
	}
	p := start(c.tb, fmt.Sprintf("nats-%d", i), c.bin+"/natsnode", args...)
	p.waitLine(c.tb, time.Time{}, startTimeout, "ready")
	if i < len(c.nats) {
		c.nats[i] = p
	} else {
		c.nats = append(c.nats, p)
	}
}

// natsURLs lists every node's client URL, node first first.
func (c *cluster) natsURLs(first int) string {
	var urls []string
	for k := range c.natsPorts {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", c.natsPorts[(first+k)%len(c.natsPorts)]))
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
