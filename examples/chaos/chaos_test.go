package chaos

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestChaos runs a cluster as an operator would — three natsnode
// processes routed as one NATS cluster, three examples/server instances on
// the simulated engine (10 ms steps), one examples/gateway, every one its
// own process on loopback — under streaming clients through the gateway,
// and breaks it phase by phase: kill -9 an instance, restart it, SIGSTOP
// another (its connection stays open, silent) and SIGCONT it, SIGTERM a
// third (a graceful drain), kill -9 a NATS node. Targets: no request
// fails before its first token in any phase; no stream is interrupted in
// any phase (the gateway resumes the streams a kill -9 or a SIGSTOP cuts
// on another instance, from the tokens they delivered; one that had
// delivered every token gets its final chunk there), and those streams
// wait well under the heartbeat timeout for it (loosely: p99 1.5 s after
// kill -9, 2 s after SIGSTOP; BENCHMARKS.md has the runs against the
// 500 ms target); the killed instance leaves the gateway's rotation
// within 1 s, the stopped one within 2 s.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinaries(t)
	// 30 clients on three instances of 8 sequences a batch: a few
	// requests queue on every instance, so a kill leaves some that have no
	// token yet to fail over.
	const clients = 30
	c := newCluster(t, bin, 3, "-max-batch", "8")
	names := []string{"i1", "i2", "i3"}
	for i, name := range names {
		c.startInstance(name, i)
	}
	began := time.Now()
	c.startGateway("-v") // logs every request sent on to another instance
	for _, name := range names {
		c.waitFound(name, began.Add(-time.Minute))
	}

	const phaseTime = 3 * time.Second
	var phases []*phase
	next := func(name string) *phase {
		now := time.Now()
		if len(phases) > 0 {
			phases[len(phases)-1].to = now
		}
		p := &phase{name: name, from: now}
		phases = append(phases, p)
		return p
	}
	l := startLoad(c.gwURL, clients, 32, next("baseline"))
	time.Sleep(phaseTime)

	// kill -9 an instance: it and its queued requests must leave within 1 s.
	p := next("kill -9 instance i1")
	killPhase := p
	l.current.Store(p)
	killed := time.Now()
	c.instances["i1"].kill()
	if gone, ok := c.gw.lineAfter(killed, 10*time.Second, "removed", "instance=i1"); ok {
		p.leftAfter = gone.at.Sub(killed)
	} else {
		t.Errorf("the gateway did not drop i1 within 10 s of its kill -9:\n%s", c.gw.output())
	}
	// The streams the kill cut resume on the other instances once the
	// gateway finds i1 gone (a probe, 250 ms); the phase lasts long enough
	// for them to end in it even were they to wait for three missed
	// heartbeats (3 s by default).
	time.Sleep(time.Until(killed.Add(phaseTime + 2*time.Second)))

	// The killed instance comes back under its name.
	p = next("restart i1")
	l.current.Store(p)
	restarted := time.Now()
	c.startInstance("i1", 0)
	c.waitFound("i1", restarted)
	time.Sleep(time.Until(restarted.Add(phaseTime)))

	// SIGSTOP an instance: its connection stays open, so the NATS server
	// answers its probes with silence, not "no responders"; it must leave
	// after the gateway's probe timeout, its streams resumed elsewhere.
	p = next("SIGSTOP instance i3")
	l.current.Store(p)
	stopPhase := p
	stopped := time.Now()
	c.instances["i3"].signal(syscall.SIGSTOP)
	if gone, ok := c.gw.lineAfter(stopped, 10*time.Second, "removed", "instance=i3"); ok {
		p.leftAfter = gone.at.Sub(stopped)
	} else {
		t.Errorf("the gateway did not drop i3 within 10 s of its SIGSTOP:\n%s", c.gw.output())
	}
	time.Sleep(time.Until(stopped.Add(phaseTime)))
	continued := time.Now()
	c.instances["i3"].signal(syscall.SIGCONT)
	c.waitFound("i3", continued)

	// SIGTERM: a graceful drain, nothing lost.
	p = next("SIGTERM instance i2")
	termPhase := p
	l.current.Store(p)
	termed := time.Now()
	c.instances["i2"].signal(syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := c.instances["i2"].wait(ctx); err != nil {
		t.Errorf("i2 did not stop within 30 s of SIGTERM")
	}
	cancel()
	time.Sleep(time.Until(termed.Add(phaseTime)))

	// kill -9 the NATS node the gateway and i1 are connected to.
	p = next("kill -9 NATS node 0")
	natsPhase := p
	l.current.Store(p)
	nodeKilled := time.Now()
	c.nats[0].kill()
	time.Sleep(time.Until(nodeKilled.Add(phaseTime)))
	l.stop()
	phases[len(phases)-1].to = time.Now()

	var b strings.Builder
	fmt.Fprintf(&b, "\n| phase | requests | completed | failed before 1st token | interrupted | refused | failed over | resumed | resume gap p50 / p99 / max | left rotation after | TTFT p50 | TTFT p99 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	for _, p := range phases {
		s := p.summary()
		left, gap := "-", "-"
		if p.leftAfter > 0 {
			left = ms(p.leftAfter).String()
		}
		if s.resumed > 0 {
			gap = fmt.Sprintf("%v / %v / %v", ms(s.gapP50), ms(s.gapP99), ms(s.gapMax))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %s | %s | %v | %v |\n", p.name, s.requests, s.completed, s.failedEarly+s.refused,
			s.interrupted, s.refused, c.gw.count(p.from, p.to, "failing over"), s.resumed, gap, left, ms(s.p50), ms(s.p99))
	}
	t.Log(b.String())

	for _, p := range phases {
		s := p.summary()
		if s.failedEarly+s.refused > 0 {
			t.Errorf("%s: %d requests failed before their first token (%d refused)", p.name, s.failedEarly+s.refused, s.refused)
		}
		if s.completed == 0 {
			t.Errorf("%s: no request completed", p.name)
		}
	}
	if s := killPhase.summary(); s.interrupted > 0 {
		t.Errorf("kill -9 interrupted %d streams, want 0 (the gateway resumes them on another instance)", s.interrupted)
	}
	if s := stopPhase.summary(); s.interrupted > 0 {
		t.Errorf("SIGSTOP interrupted %d streams, want 0 (the gateway resumes them on another instance)", s.interrupted)
	}
	if s := termPhase.summary(); s.interrupted > 0 {
		t.Errorf("SIGTERM interrupted %d streams, want 0", s.interrupted)
	}
	if s := natsPhase.summary(); s.interrupted > 0 {
		t.Errorf("the NATS node's loss interrupted %d streams, want 0 (lost chunk messages are sent again)", s.interrupted)
	}
	// The resume gap as the clients saw it (their longest wait between
	// two chunks of a resumed stream): about a probe interval to find i1
	// gone, plus a place on a busy instance. The target is p99 500 ms
	// (BENCHMARKS.md has the runs); asserted loosely, as this machine's
	// load adds to it, yet well below the three missed heartbeats (3 s)
	// such streams waited before the probe ended them.
	if s := killPhase.summary(); s.resumed > 0 && s.gapP99 > 1500*time.Millisecond {
		t.Errorf("kill -9: %d resumed streams waited p50 %v, p99 %v between chunks; want p99 under 1.5 s (target 500 ms)", s.resumed, s.gapP50, s.gapP99)
	}
	// The same after SIGSTOP, plus the probe timeout (200 ms).
	if s := stopPhase.summary(); s.resumed > 0 && s.gapP99 > 2*time.Second {
		t.Errorf("SIGSTOP: %d resumed streams waited p50 %v, p99 %v between chunks; want p99 under 2 s", s.resumed, s.gapP50, s.gapP99)
	}
	if left := stopPhase.leftAfter; left > 2*time.Second {
		t.Errorf("the stopped instance left the rotation after %v, want within 2 s", left)
	}
	if left := killPhase.leftAfter; left > time.Second {
		t.Errorf("the killed instance left the rotation after %v, want within 1 s", left)
	}
	if t.Failed() {
		t.Logf("gateway log:\n%s", c.gw.output())
	}
}
