package pyproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// protocolVersion is the version of PROTOCOL.md this supervisor speaks.
const protocolVersion = 1

// reply is any line a worker writes: a handshake, a heartbeat or a reply.
type reply struct {
	ID       uint64         `json:"id"`
	Type     string         `json:"type"`
	OK       bool           `json:"ok"`
	Error    *wireError     `json:"error"`
	Tokens   []int32        `json:"tokens"`
	Logprobs []float32      `json:"logprobs"`
	Top      [][][2]float64 `json:"top"`
	Reused   int            `json:"reused"`
	Evicted  []string       `json:"evicted"`
	// FreeBlocks is the worker's free KV blocks after an open, step or
	// free of a paged model; nil when the reply has none.
	FreeBlocks *int      `json:"free_blocks"`
	Info       *wireInfo `json:"info"`
	Warmed     []int     `json:"batch_sizes"`
	// Lookahead: per sampling input, the tokens decoded after Tokens.
	More         [][]int32   `json:"more"`
	MoreLogprobs [][]float32 `json:"more_logprobs"`
	// Embeddings: per sampling input, a pooled sequence's vector (base64
	// of little-endian float32), null for a generating input.
	Embeddings []*string `json:"embeddings"`
	// A device trace's files and summary (the trace op).
	File    string `json:"file"`
	Summary string `json:"summary"`

	Protocol int            `json:"protocol"`
	Backend  string         `json:"backend"`
	PID      int            `json:"pid"`
	Versions map[string]any `json:"versions"`
	Stats    map[string]any `json:"models"`
	Caps     map[string]any `json:"capabilities"`
}

type wireInfo struct {
	ContextLength int     `json:"context_length"`
	VocabSize     int     `json:"vocab_size"`
	BOS           int32   `json:"bos"`
	EOS           []int32 `json:"eos"`
	KVCapacity    int     `json:"kv_capacity"`
	MaxBatch      int     `json:"max_batch"`
	Device        string  `json:"device"`
	DType         string  `json:"dtype"`
	WeightBytes   int64   `json:"weight_bytes"`
	KVBytes       int64   `json:"kv_bytes"`
	BlockSize     int     `json:"block_size"`
	KVBlocks      int     `json:"kv_blocks"`
	StepTokens    int     `json:"step_tokens"`
	FullGroups    int     `json:"full_groups"`
	SlidingGroups int     `json:"sliding_groups"`
	Window        int     `json:"window"`
	WindowBlocks  int     `json:"window_blocks"`
	EmbedDim      int     `json:"embed_dim"`
	Encoder       bool    `json:"encoder"`
	// TP is the tensor-parallel ranks (absent: 1); WeightBytes and KVBytes
	// are then one rank's, per device.
	TP int `json:"tp"`
	// LoRA slots (absent: the backend serves no adapters).
	AdapterSlots     int   `json:"adapter_slots"`
	MaxAdapterRank   int   `json:"max_adapter_rank"`
	AdapterBytes     int64 `json:"adapter_bytes"`
	AdapterSlotBytes int64 `json:"adapter_slot_bytes"`
}

var heartbeatLine = []byte(`{"type":"hb"}`)

// proc is one running worker process. Calls may come from several
// goroutines: writes are serialised by wmu, replies are matched to callers
// by request id.
type proc struct {
	slot    int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	log     *slog.Logger
	maxLine int
	hello   reply

	wmu  sync.Mutex
	wbuf []byte

	pmu     sync.Mutex
	pending map[uint64]chan *reply
	nextID  atomic.Uint64

	lastSeen atomic.Int64 // unix nanos of the last line read
	failOnce sync.Once
	reason   string        // why the process is gone; set before dead closes
	dead     chan struct{} // closed when the process has exited and been reaped
	stop     chan struct{} // closed to stop the watchdog early
}

// startProc launches a worker and waits for its handshake.
// The runtime directory is verified first, every time: a worker restarted
// hours later runs exactly the files this binary embeds, or does not start.
func startProc(ctx context.Context, cfg *config, runtimeDir string, slot int) (*proc, error) {
	if err := verifyRuntime(runtimeDir); err != nil {
		return nil, err
	}
	// -B: no bytecode cache is written (or trusted: verifyRuntime refuses one).
	args := []string{"-u", "-B", filepath.Join(runtimeDir, "worker.py"),
		"--backend", cfg.backend,
		"--heartbeat", strconv.FormatFloat(cfg.hbInterval.Seconds(), 'f', -1, 64),
		"--max-line", strconv.Itoa(cfg.maxLine),
		"--threads", strconv.Itoa(cfg.threads),
		"--settings", cfg.tuning.settingsArg()}
	if cfg.faults {
		args = append(args, "--faults")
	}
	if n := cfg.tensorParallel(); n > 1 { // rank 0 starts the other ranks (PROTOCOL.md)
		args = append(args, "--tp", strconv.Itoa(n))
	}
	cmd := exec.Command(cfg.python, args...)
	cmd.Dir = runtimeDir
	cmd.Env = workerEnv(cfg, slot)
	p := &proc{slot: slot, cmd: cmd, log: cfg.logger.With("worker", slot), maxLine: cfg.maxLine,
		pending: map[uint64]chan *reply{}, dead: make(chan struct{}), stop: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: Python interpreter %q not found: install Python 3 with PyTorch (Debian: apt-get install python3 python3-torch python3-numpy) or pass pyproc.WithPython: %v",
				engine.ErrUnavailable, cfg.python, err)
		}
		return nil, fmt.Errorf("%w: starting %s: %v", engine.ErrUnavailable, cfg.python, err)
	}
	p.stdin = stdin
	p.lastSeen.Store(time.Now().UnixNano())
	hello := make(chan *reply, 1)
	errDone := make(chan struct{})
	go p.forwardStderr(stderr, errDone)
	go p.readLoop(bufio.NewReaderSize(stdout, 64<<10), hello, errDone)
	return p, p.handshake(ctx, cfg, hello)
}

// workerEnv is the worker's environment: this process's, with the
// devices of its slot, and under tensor parallel NCCL's asynchronous
// error handling on unless the host sets it (a collective that times out
// then ends the group instead of hanging it). Later entries win, so the
// defaults go first. The worker reads no variable of its own (its
// settings come with --settings).
func workerEnv(cfg *config, slot int) []string {
	var env []string
	if cfg.tensorParallel() > 1 {
		env = append(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "NCCL_ASYNC_ERROR_HANDLING=1")
	}
	env = append(env, os.Environ()...)
	if v := cfg.visibleDevices(slot); v != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+v)
	}
	return env
}

func (p *proc) handshake(ctx context.Context, cfg *config, hello chan *reply) error {
	timer := time.NewTimer(cfg.startTimeout)
	defer timer.Stop()
	var h *reply
	select {
	case h = <-hello:
	case <-p.dead:
		return fmt.Errorf("%w: worker exited during start-up (%s); see its stderr in the log", engine.ErrUnavailable, p.reason)
	case <-timer.C:
		p.fail("no handshake within " + cfg.startTimeout.String())
		return fmt.Errorf("%w: worker sent no handshake within %v", engine.ErrUnavailable, cfg.startTimeout)
	case <-ctx.Done():
		p.fail("start cancelled")
		return ctx.Err()
	}
	if h.Error != nil {
		p.fail("refused to start")
		return fmt.Errorf("%w: %s", engine.ErrUnavailable, h.Error.Message)
	}
	if h.Protocol != protocolVersion {
		p.fail("protocol mismatch")
		return fmt.Errorf("%w: worker speaks protocol %d, supervisor %d", engine.ErrUnavailable, h.Protocol, protocolVersion)
	}
	if missing := unreadParams(h.Caps); len(missing) > 0 {
		p.fail("params keys not read")
		return fmt.Errorf("%w: the worker does not read the params keys %q the supervisor writes", engine.ErrUnavailable, missing)
	}
	p.hello = *h
	p.log.Info("worker ready", "pid", h.PID, "backend", h.Backend, "versions", h.Versions)
	go p.watchdog(cfg.hbInterval, cfg.hbTimeout)
	return nil
}

func (p *proc) pid() int {
	if p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// fail records why the worker is being given up and kills it. The first
// reason wins.
func (p *proc) fail(reason string) {
	p.failOnce.Do(func() {
		p.reason = reason
		p.log.Warn("killing worker", "pid", p.pid(), "reason", reason)
		_ = p.cmd.Process.Kill()
	})
}

// lost is the error callers get for work that was on this worker.
func (p *proc) lost() error {
	<-p.dead
	return &LostError{Worker: p.slot, PID: p.pid(), Reason: p.reason}
}

func (p *proc) alive() bool {
	select {
	case <-p.dead:
		return false
	default:
		return true
	}
}

func (p *proc) forwardStderr(r io.Reader, done chan struct{}) {
	defer close(done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		level := slog.LevelInfo
		switch {
		case strings.HasPrefix(line, "WARNING"):
			level = slog.LevelWarn
		case strings.HasPrefix(line, "ERROR"), strings.HasPrefix(line, "Traceback"):
			level = slog.LevelError
		}
		p.log.Log(context.Background(), level, line)
	}
	_, _ = io.Copy(io.Discard, r)
}

// readLoop reads the worker's stdout until EOF, then reaps the process and
// fails every pending call.
func (p *proc) readLoop(r *bufio.Reader, hello chan *reply, errDone chan struct{}) {
	for {
		line, err := readLine(r, p.maxLine)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.fail(err.Error())
			}
			break
		}
		p.lastSeen.Store(time.Now().UnixNano())
		if bytes.Equal(line, heartbeatLine) {
			continue
		}
		rep := new(reply)
		if err := json.Unmarshal(line, rep); err != nil {
			p.fail(fmt.Sprintf("protocol violation: unreadable line %.60q", line))
			continue
		}
		if rep.Type == "hello" {
			select {
			case hello <- rep:
			default:
				p.fail("protocol violation: a second handshake")
			}
			continue
		}
		p.deliver(rep)
	}
	_, _ = io.Copy(io.Discard, r)
	<-errDone
	err := p.cmd.Wait()
	p.failOnce.Do(func() { p.reason = fmt.Sprintf("exited: %v", err) })
	if p.reason == "" {
		p.reason = "exited"
	}
	close(p.dead)
	p.pmu.Lock()
	p.pending = nil
	p.pmu.Unlock()
}

var errLineTooLong = errors.New("protocol violation: line exceeds the limit")

// readLine returns one line without its newline, refusing lines longer
// than limit.
func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err == nil {
		return line[:len(line)-1], nil
	}
	if !errors.Is(err, bufio.ErrBufferFull) {
		return nil, err
	}
	buf := append([]byte(nil), line...)
	for {
		line, err = r.ReadSlice('\n')
		buf = append(buf, line...)
		if len(buf) > limit+1 {
			return nil, errLineTooLong
		}
		if err == nil {
			return buf[:len(buf)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

func (p *proc) deliver(rep *reply) {
	p.pmu.Lock()
	ch, ok := p.pending[rep.ID]
	delete(p.pending, rep.ID)
	p.pmu.Unlock()
	if ok {
		ch <- rep
	} else if rep.ID == 0 && rep.Error != nil {
		p.fail("worker could not read a request: " + rep.Error.Message)
	}
}

// busyLimit is how many heartbeat timeouts a silent worker that the kernel
// shows working or waiting for a CPU is given before it is killed.
const busyLimit = 4

// watchdog kills the worker when no line (heartbeat or reply) arrived for
// timeout and the kernel does not show it busy (see silence), or for
// busyLimit timeouts whatever it shows.
func (p *proc) watchdog(interval, timeout time.Duration) {
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	judge := silence{hardLimit: busyLimit}
	for {
		select {
		case <-p.dead:
			return
		case <-t.C:
			silent := time.Since(time.Unix(0, p.lastSeen.Load()))
			if why := judge.judge(p.cmd.Process.Pid, silent.Seconds(), timeout.Seconds()); why != "" {
				p.fail(why)
			}
		}
	}
}
