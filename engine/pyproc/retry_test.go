package pyproc

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// waitReplaced waits until worker i runs a process other than old.
func waitReplaced(t *testing.T, e *Engine, i int, old *proc) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		p, err := e.slots[i].current(ctx, e.closing)
		if err != nil {
			t.Fatalf("worker %d not replaced: %v", i, err)
		}
		if p != old {
			return p
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBreakerRoutesAway: a worker lost under a sequence opens its breaker
// (set to trip on one failure); new sequences then go to the other worker
// although the replacement is idle, and Workers and Breakers say so.
func TestBreakerRoutesAway(t *testing.T) {
	e := newEngine(t, WithWorkers(2), WithBreaker(retry.WithTrip(1, 0, 0), retry.WithOpenTimeout(time.Minute)))
	m := load(t, e, tiny(t))
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, prompt(1, 6), ""); err != nil {
		t.Fatal(err)
	}
	if m.seqs[1].slot.idx != 0 {
		t.Fatalf("first sequence on worker %d, want 0", m.seqs[1].slot.idx)
	}
	old := m.seqs[1].proc
	if err := syscall.Kill(old.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.dead
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: prompt(1, 6), Sample: true, Params: greedy}}); !errors.Is(err, engine.ErrWorkerLost) {
		t.Fatalf("step on the killed worker: %v", err)
	}
	m.Free(1, "")
	waitReplaced(t, e, 0, old)
	for id := engine.SeqID(2); id <= 4; id++ {
		if _, err := m.Open(ctx, id, prompt(int(id), 6), ""); err != nil {
			t.Fatal(err)
		}
		if w := m.seqs[id].slot.idx; w != 1 {
			t.Errorf("sequence %d routed to worker %d, whose breaker is open", id, w)
		}
	}
	w := e.Workers()
	if w[0].Breaker != retry.StateOpen || w[1].Breaker != retry.StateClosed {
		t.Errorf("breakers: worker 0 %v, worker 1 %v; want open, closed", w[0].Breaker, w[1].Breaker)
	}
	if b := e.Breakers(); b[0].Name != "worker-0" || b[0].State != retry.StateOpen {
		t.Errorf("Breakers()[0] = %+v", b[0])
	}
	for id := engine.SeqID(2); id <= 4; id++ {
		m.Free(id, "")
	}
}

// TestRetriedRequestIsIdentical kills the worker running a request's first
// step through the whole Server: the batcher retries it on the other
// worker and the text is exactly that of an undisturbed run, greedy and
// seeded. A worker killed after the first token resumes the stream on the
// other worker, greedy, seeded and penalised alike.
func TestRetriedRequestIsIdentical(t *testing.T) {
	e := newEngine(t, WithWorkers(2), withFaults())
	srv, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(t)}); err != nil {
		t.Fatal(err)
	}
	if b := srv.Stats()["tiny"].Breakers; len(b) != 2 || b[0].Name != "worker-0" || b[1].State != retry.StateClosed {
		t.Errorf("Server.Stats breakers: %+v", b)
	}
	run := func(p engine.SamplingParams) (api.Result, error) {
		st, err := srv.Generate(ctx, api.Request{Model: "tiny", PromptTokens: prompt(3, 9),
			Params: api.Params{MaxTokens: 16, IgnoreEOS: true, Sampling: p}})
		if err != nil {
			return api.Result{}, err
		}
		return st.Collect()
	}
	for name, p := range map[string]engine.SamplingParams{
		"greedy": {},
		"seeded": {Temperature: 0.9, TopP: 0.95, Seed: 42, HasSeed: true},
	} {
		t.Run(name, func(t *testing.T) {
			want, err := run(p)
			if err != nil {
				t.Fatal(err)
			}
			victim := inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 3})
			inject(t, e, 1, map[string]any{"kind": "step_delay", "seconds": 3})
			go func() {
				time.Sleep(400 * time.Millisecond) // the first step is on a worker, delayed
				_ = syscall.Kill(victim.pid(), syscall.SIGKILL)
			}()
			got, err := run(p)
			if err != nil {
				t.Fatal(err)
			}
			// The step on worker 1 (if the request was there) waited 3 s
			// and succeeded; only a request on worker 0 was retried.
			if !slices.Equal(got.Tokens, want.Tokens) || got.Text != want.Text {
				t.Errorf("retried: %v %q, undisturbed: %v %q", got.Tokens, got.Text, want.Tokens, want.Text)
			}
			if got.Usage.Preemptions != 1 {
				t.Errorf("preemptions %d, want 1 (the request runs on worker 0 first)", got.Usage.Preemptions)
			}
			inject(t, e, 1, map[string]any{"kind": "step_delay", "seconds": 0})
			waitReplaced(t, e, 0, victim)
		})
	}

	// Killed after tokens reached the caller: the stream resumes on a
	// live worker and ends as an undisturbed one, seeded ones too (the
	// torch runtime follows engine.SamplingParams.Generated).
	after := func(t *testing.T, p engine.SamplingParams) ([]int32, error) {
		st, err := srv.Generate(ctx, api.Request{Model: "tiny", PromptTokens: prompt(4, 9),
			Params: api.Params{MaxTokens: 200, IgnoreEOS: true, Sampling: p}})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		c, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		toks := []int32{c.Token}
		for _, w := range e.Workers() {
			if w.Sequences > 0 {
				_ = syscall.Kill(w.PID, syscall.SIGKILL)
			}
		}
		for {
			c, err := st.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				return toks, err
			}
			if c.HasToken {
				toks = append(toks, c.Token)
			}
		}
	}
	t.Run("greedy, after the first token", func(t *testing.T) {
		st, err := srv.Generate(ctx, api.Request{Model: "tiny", PromptTokens: prompt(4, 9), Params: api.Params{MaxTokens: 200, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		undisturbed, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		got, err := after(t, engine.SamplingParams{})
		if err != nil || !slices.Equal(got, undisturbed.Tokens) {
			t.Fatalf("resumed stream: %v, %d tokens; want the undisturbed %d tokens", err, len(got), len(undisturbed.Tokens))
		}
		if n := srv.Stats()["tiny"].Batcher.Resumed; n < 1 {
			t.Errorf("Stats().Batcher.Resumed = %d after a resumed stream", n)
		}
	})
	t.Run("seeded and penalised, after the first token", func(t *testing.T) {
		for i := range e.Workers() {
			waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := e.slots[i].current(waitCtx, e.closing)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		p := engine.SamplingParams{Temperature: 0.9, Seed: 5, HasSeed: true, PresencePenalty: 0.7, FrequencyPenalty: 0.4}
		st, err := srv.Generate(ctx, api.Request{Model: "tiny", PromptTokens: prompt(4, 9), Params: api.Params{MaxTokens: 200, IgnoreEOS: true, Sampling: p}})
		if err != nil {
			t.Fatal(err)
		}
		undisturbed, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		got, err := after(t, p)
		if err != nil || !slices.Equal(got, undisturbed.Tokens) {
			t.Fatalf("resumed seeded stream: %v, %d tokens; want the undisturbed %d tokens", err, len(got), len(undisturbed.Tokens))
		}
	})
}

// TestRestartPolicyGivesUp: a worker that cannot be restarted is retried
// as the restart policy says and then given up; its slot stays empty and
// new sequences go to the live worker.
func TestRestartPolicyGivesUp(t *testing.T) {
	dir := t.TempDir()
	count := dir + "/starts"
	// The interpreter works for the first two starts (the pool), then
	// refuses, as a broken installation would.
	script := dir + "/python"
	body := "#!/bin/sh\necho x >> " + count + "\n[ \"$(wc -l < " + count + ")\" -le 2 ] || exit 3\nexec " + python(t) + " \"$@\"\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	policy := retry.MustPolicy(retry.WithBackoff(10*time.Millisecond, 10*time.Millisecond, 1),
		retry.WithMaxAttempts(3), retry.WithClassifier(func(error) bool { return true }))
	e := newEngine(t, WithWorkers(2), WithPython(script), WithRestartPolicy(policy))
	m := load(t, e, tiny(t))
	old, err := e.slots[0].current(context.Background(), e.closing)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(old.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.dead
	waitFor := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(count)
		if strings.Count(string(b), "x") >= 4 { // 2 pool starts + 2 refused restarts
			break
		}
		if time.Now().After(waitFor) {
			t.Fatalf("restart attempts: %q", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a third attempt would come 10 ms later
	if b, _ := os.ReadFile(count); strings.Count(string(b), "x") != 4 {
		t.Errorf("%d starts, want 2 + 2 restart attempts (3 attempts in all)", strings.Count(string(b), "x"))
	}
	if w := e.Workers(); w[0].PID != 0 || w[1].PID == 0 {
		t.Fatalf("workers after giving up: %+v", w)
	}
	if _, err := e.slots[0].current(context.Background(), e.closing); !errors.Is(err, engine.ErrWorkerLost) {
		t.Errorf("the given-up slot: %v, want a lost-worker error", err)
	}
	for id := engine.SeqID(1); id <= 3; id++ {
		if _, err := m.Open(context.Background(), id, prompt(int(id), 5), ""); err != nil {
			t.Fatal(err)
		}
		if m.seqs[id].slot.idx != 1 {
			t.Errorf("sequence %d on worker %d, whose slot is empty", id, m.seqs[id].slot.idx)
		}
		m.Free(id, "")
	}
}
