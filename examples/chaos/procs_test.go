package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildBinaries builds examples/server, examples/gateway and natsnode into
// a temporary directory (from the build cache when nothing changed).
func buildBinaries(tb testing.TB) string {
	tb.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		tb.Skip("no go command to build the processes with")
	}
	dir := tb.TempDir()
	cmd := exec.Command(goBin, "build", "-o", dir+string(filepath.Separator),
		"./examples/server", "./examples/gateway", "./internal/natstest/natsnode")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// line is one line a process wrote, with when it was read.
type line struct {
	at   time.Time
	text string
}

// proc is a child process whose output is kept, line by line, to wait
// for what it logs.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}

	mu    sync.Mutex
	lines []line
	grew  chan struct{} // closed and replaced on every new line
}

func start(tb testing.TB, name, bin string, args ...string) *proc {
	tb.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), exited: make(chan struct{}), grew: make(chan struct{})}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p.cmd.Stderr = p.cmd.Stdout
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go p.read(out)
	tb.Cleanup(func() { p.kill() })
	return p
}

func (p *proc) read(r io.Reader) {
	defer close(p.exited)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, line{time.Now(), sc.Text()})
		close(p.grew)
		p.grew = make(chan struct{})
		p.mu.Unlock()
	}
	_ = p.cmd.Wait()
}

// waitLine waits for a line written at or after since that holds every
// one of parts, and returns it.
func (p *proc) waitLine(tb testing.TB, since time.Time, timeout time.Duration, parts ...string) line {
	tb.Helper()
	l, ok := p.lineAfter(since, timeout, parts...)
	if !ok {
		tb.Fatalf("%s wrote no line with %q in %v; it wrote:\n%s", p.name, parts, timeout, p.output())
	}
	return l
}

func (p *proc) lineAfter(since time.Time, timeout time.Duration, parts ...string) (line, bool) {
	deadline := time.After(timeout)
	seen := 0
	for {
		p.mu.Lock()
		lines, grew := p.lines, p.grew
		p.mu.Unlock()
	next:
		for ; seen < len(lines); seen++ {
			l := lines[seen]
			if l.at.Before(since) {
				continue
			}
			for _, part := range parts {
				if !strings.Contains(l.text, part) {
					continue next
				}
			}
			return l, true
		}
		select {
		case <-grew:
		case <-p.exited:
			select {
			case <-grew:
			default:
				return line{}, false
			}
		case <-deadline:
			return line{}, false
		}
	}
}

// count counts the lines written from from to to that hold part.
func (p *proc) count(from, to time.Time, part string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if !l.at.Before(from) && l.at.Before(to) && strings.Contains(l.text, part) {
			n++
		}
	}
	return n
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.lines {
		fmt.Fprintf(&b, "%s %s\n", l.at.Format("15:04:05.000"), l.text)
	}
	return b.String()
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// kill ends the process at once (SIGKILL) and waits for it.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.exited
}

// wait waits for the process to exit by itself.
func (p *proc) wait(ctx context.Context) error {
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// field returns the value of key=value in a logged line.
func field(text, key string) string {
	for _, f := range strings.Fields(text) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
