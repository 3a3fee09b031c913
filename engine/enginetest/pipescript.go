package enginetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// logprobTolerance is how far a log-probability of a pipelined step may
// be from the synchronous one: the rows are the same, but an engine may
// launch them on another path.
const logprobTolerance = 1e-4

// scriptSeq is one sequence of a pipeline script.
type scriptSeq struct {
	prompt []int32
	chunk  int // prompt chunk size; 0 feeds the prompt whole
	start  int // the step it joins at
	n      int // tokens it keeps
	// eos marks a sequence whose end the caller sees only when it reads
	// the n-th token (an EOS, a stop string): the step after that one
	// already carries a row for it, whose output is dropped. Without it
	// the caller knows the length ahead and plans no such row.
	eos    bool
	params *engine.SamplingParams
}

// budget is the samples the script's steps take for q.
func (q *scriptSeq) budget() int {
	if q.eos {
		return q.n + 1
	}
	return q.n
}

// scriptRow is one input of a script step: prompt tokens [from, to) of
// sequence seq, or a decode of its last token when from == to.
type scriptRow struct {
	seq      int
	from, to int
	sample   bool
}

// scriptSteps plans the steps of seqs: from its start on, every
// unfinished sequence has a row in every step, so every decode row
// follows a step in which its sequence sampled.
func scriptSteps(seqs []scriptSeq) [][]scriptRow {
	fed, samples := make([]int, len(seqs)), make([]int, len(seqs))
	var steps [][]scriptRow
	for step := 0; ; step++ {
		var rows []scriptRow
		active := false
		for i := range seqs {
			q := &seqs[i]
			if samples[i] == q.budget() {
				continue
			}
			active = true
			if step < q.start {
				continue
			}
			r := scriptRow{seq: i, from: fed[i], to: fed[i], sample: true}
			if fed[i] < len(q.prompt) {
				r.to = len(q.prompt)
				if q.chunk > 0 {
					r.to = min(fed[i]+q.chunk, r.to)
				}
				r.sample = r.to == len(q.prompt)
				fed[i] = r.to
			}
			if r.sample {
				samples[i]++
			}
			rows = append(rows, r)
		}
		if !active {
			return steps
		}
		if len(rows) > 0 {
			steps = append(steps, rows)
		}
	}
}

// scriptRun runs a script's steps on a model, synchronously or
// pipelined, and keeps each sequence's outputs.
type scriptRun struct {
	ctx   context.Context
	m     engine.Model
	pl    engine.Pipeliner // nil: synchronous
	seqs  []scriptSeq
	steps [][]scriptRow
	ids   []engine.SeqID
	drain int // the step a pipelined run sends after waiting for the one before

	outs  [][]engine.StepOutput // each sequence's outputs, dropped ones included
	open  []bool
	freed []bool
	sent  int // the steps sent so far
}

// freeAll frees what the run left open.
func (r *scriptRun) freeAll() {
	for i, id := range r.ids {
		if r.open[i] && !r.freed[i] {
			r.m.Free(id, "")
		}
	}
}

// batch builds step i's inputs; prev: a step is pending, in which every
// decoding sequence samples.
func (r *scriptRun) batch(i int, prev bool) []engine.StepInput {
	var b []engine.StepInput
	for _, row := range r.steps[i] {
		q := &r.seqs[row.seq]
		in := engine.StepInput{Seq: r.ids[row.seq], Sample: row.sample, Params: q.params}
		switch {
		case row.from < row.to:
			in.Tokens = q.prompt[row.from:row.to]
		case prev:
			in.Prev = true
		default:
			out := r.outs[row.seq]
			in.Tokens = []int32{out[len(out)-1].Token}
		}
		b = append(b, in)
	}
	return b
}

// joining returns the sequences whose first row is in step i.
func (r *scriptRun) joining(i int) []int {
	if i >= len(r.steps) {
		return nil
	}
	var js []int
	for _, row := range r.steps[i] {
		if !r.open[row.seq] && row.from == 0 && row.to > 0 {
			js = append(js, row.seq)
		}
	}
	return js
}

// deliver checks step i's outputs and hands them to their sequences,
// freeing each sequence whose row in the steps sent is its last: a
// sequence that ends early (eos) is freed while its dropped row is
// pending when the step holding it was sent already.
func (r *scriptRun) deliver(i int, outs []engine.StepOutput) error {
	j := 0
	for _, row := range r.steps[i] {
		if !row.sample {
			continue
		}
		if j >= len(outs) {
			return fmt.Errorf("step %d: %d outputs for more sampling inputs", i, len(outs))
		}
		if o := outs[j]; o.Seq != r.ids[row.seq] {
			return fmt.Errorf("step %d: output %d is for sequence %d, want %d (outputs follow input order)", i, j, o.Seq, r.ids[row.seq])
		}
		r.outs[row.seq] = append(r.outs[row.seq], outs[j])
		j++
	}
	if j != len(outs) {
		return fmt.Errorf("step %d: %d outputs for %d sampling inputs", i, len(outs), j)
	}
	for s, q := range r.seqs {
		n := len(r.outs[s])
		if r.freed[s] || !r.open[s] || n < q.n {
			continue
		}
		if n == q.budget() || r.sent > i+1 { // the eos row is in a step sent: free it behind that step
			r.m.Free(r.ids[s], "")
			r.freed[s] = true
		}
	}
	return nil
}

// run runs the script.
func (r *scriptRun) run() error {
	n := len(r.seqs)
	r.outs, r.open, r.freed = make([][]engine.StepOutput, n), make([]bool, n), make([]bool, n)
	if r.pl == nil {
		return r.runSync()
	}
	return r.runPipelined()
}

func (r *scriptRun) runSync() error {
	for i := range r.steps {
		for _, s := range r.joining(i) {
			if _, err := r.m.Open(r.ctx, r.ids[s], r.seqs[s].prompt, ""); err != nil {
				return fmt.Errorf("open sequence %d: %w", r.ids[s], err)
			}
			r.open[s] = true
		}
		outs, err := r.m.Step(r.ctx, r.batch(i, false))
		if err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		r.sent = i + 1
		if err := r.deliver(i, outs); err != nil {
			return err
		}
	}
	return nil
}

// errDeclined is a StepAsync that answered ok false.
var errDeclined = errors.New("StepAsync declined the batch")

// runPipelined sends each step before it waits for the one before, with
// Prev rows, except step r.drain, sent after that wait with explicit
// tokens. The sequences joining a step are opened with OpenAsync while
// the step two before it is pending, and their opens waited for after
// it.
func (r *scriptRun) runPipelined() (err error) {
	opens, err := r.openAsync(0)
	if err != nil {
		return err
	}
	if err := r.waitOpens(opens); err != nil {
		return err
	}
	var pend engine.PendingStep
	defer func() {
		if pend != nil { // a failed run leaves no step pending behind it
			_, _ = pend.Wait(r.ctx)
		}
	}()
	for i := range r.steps {
		if opens, err = r.openAsync(i + 1); err != nil {
			return err
		}
		if i == r.drain && pend != nil {
			p := pend
			pend = nil
			if err := r.wait(i-1, p); err != nil {
				return err
			}
		}
		p, ok, err := r.pl.StepAsync(r.ctx, r.batch(i, pend != nil))
		switch {
		case err != nil:
			return fmt.Errorf("StepAsync of step %d: %w", i, err)
		case !ok:
			return fmt.Errorf("step %d (%d inputs): %w", i, len(r.steps[i]), errDeclined)
		}
		r.sent = i + 1
		prev := pend
		pend = p
		if prev != nil {
			if err := r.wait(i-1, prev); err != nil {
				return err
			}
		}
		if err := r.waitOpens(opens); err != nil {
			return err
		}
	}
	p := pend
	if pend = nil; p == nil {
		return nil
	}
	return r.wait(len(r.steps)-1, p)
}

func (r *scriptRun) wait(i int, p engine.PendingStep) error {
	outs, err := p.Wait(r.ctx)
	if err != nil {
		return fmt.Errorf("Wait of step %d: %w", i, err)
	}
	return r.deliver(i, outs)
}

// openAsync sends the opens of the sequences joining step i.
func (r *scriptRun) openAsync(i int) ([]engine.PendingOpen, error) {
	var ps []engine.PendingOpen
	for _, s := range r.joining(i) {
		p, ok := r.pl.OpenAsync(r.ctx, r.ids[s], r.seqs[s].prompt, "")
		if !ok {
			return nil, fmt.Errorf("OpenAsync of sequence %d declined", r.ids[s])
		}
		r.open[s] = true
		ps = append(ps, p)
	}
	return ps, nil
}

func (r *scriptRun) waitOpens(ps []engine.PendingOpen) error {
	for _, p := range ps {
		if reused, err := p.Wait(r.ctx); err != nil || reused != 0 {
			return fmt.Errorf("Wait of an open without a prefix key: reused %d, %w", reused, err)
		}
	}
	return nil
}

// checkPipelineSameTokens: a script of steps — sequences joining with
// chunked prompts, greedy, seeded with a temperature, penalised, with
// log-probabilities and top log-probabilities, two ending where the
// caller cannot see it coming so that a row of theirs is pending when
// they are freed — gives the same tokens and log-probabilities run
// synchronously (Step, explicit tokens) and pipelined (StepAsync of each
// step before the Wait of the one before, Prev rows, OpenAsync; one step
// sent after a drain, with explicit tokens).
func checkPipelineSameTokens(tb testing.TB, s *suite) {
	pl := pipeliner(tb, s.m)
	seqs := []scriptSeq{
		{prompt: s.prompt(500, 9), n: 10},
		{prompt: s.prompt(501, 13), chunk: 5, n: 9, eos: true,
			params: &engine.SamplingParams{Temperature: 0.8, TopP: 0.9, Seed: 5, HasSeed: true}},
		{prompt: s.prompt(502, 7), chunk: 3, start: 2, n: 10,
			params: &engine.SamplingParams{PresencePenalty: 0.5, FrequencyPenalty: 0.7, RepetitionPenalty: 1.2, Logprobs: true}},
		{prompt: s.prompt(503, 20), chunk: 6, start: 4, n: 8, eos: true,
			params: &engine.SamplingParams{Temperature: 1, Seed: 6, HasSeed: true, TopLogprobs: 3}},
		{prompt: s.prompt(504, 4), start: 6, n: 6, params: &engine.SamplingParams{Logprobs: true}},
	}
	greedy := &engine.SamplingParams{}
	for i := range seqs {
		if seqs[i].params == nil {
			seqs[i].params = greedy
		}
	}
	steps := scriptSteps(seqs)
	widest := 0
	for _, rows := range steps {
		widest = max(widest, len(rows))
	}
	if widest > s.info.MaxBatch {
		tb.Skipf("the script steps %d sequences at once; MaxBatch is %d", widest, s.info.MaxBatch)
	}
	runs := make([]*scriptRun, 2)
	for k, p := range []engine.Pipeliner{nil, pl} {
		r := &scriptRun{ctx: s.ctx, m: s.m, pl: p, seqs: seqs, steps: steps, drain: len(steps) / 2}
		for range seqs {
			r.ids = append(r.ids, s.id())
		}
		err := r.run()
		r.freeAll()
		switch {
		case errors.Is(err, errDeclined) && r.sent == 0:
			tb.Skipf("%v: the model runs such batches synchronously", err)
		case err != nil && p == nil:
			tb.Fatalf("the script run synchronously: %v", err)
		case err != nil:
			tb.Fatalf("the script run pipelined: %v", err)
		}
		runs[k] = r
	}
	for i, q := range seqs {
		sync, piped := runs[0].outs[i][:q.n], runs[1].outs[i][:min(q.n, len(runs[1].outs[i]))]
		if what := differ(sync, piped); what != "" {
			tb.Errorf("sequence %d (%d-token prompt, %+v): pipelined %s", i, len(q.prompt), *q.params, what)
		}
	}
}

// differ says how the pipelined outputs b differ from the synchronous a,
// or "" when they agree: the same tokens, log-probabilities within
// logprobTolerance.
func differ(a, b []engine.StepOutput) string {
	if len(a) != len(b) {
		return fmt.Sprintf("gave %d tokens, synchronously %d", len(b), len(a))
	}
	near := func(x, y float32) bool { return math.Abs(float64(x-y)) <= logprobTolerance }
	for k := range a {
		x, y := a[k], b[k]
		switch {
		case x.Token != y.Token:
			return fmt.Sprintf("token %d is %d, synchronously %d (%v / %v)", k, y.Token, x.Token, tokens(b), tokens(a))
		case !near(x.Logprob, y.Logprob):
			return fmt.Sprintf("token %d has logprob %v, synchronously %v", k, y.Logprob, x.Logprob)
		case len(x.Top) != len(y.Top):
			return fmt.Sprintf("token %d has %d top logprobs, synchronously %d", k, len(y.Top), len(x.Top))
		}
		for t := range x.Top {
			if x.Top[t].Token != y.Top[t].Token || !near(x.Top[t].Logprob, y.Top[t].Logprob) {
				return fmt.Sprintf("token %d has top logprobs %v, synchronously %v", k, y.Top, x.Top)
			}
		}
	}
	return ""
}

// tokens lists the tokens of outs.
func tokens(outs []engine.StepOutput) []int32 {
	t := make([]int32, len(outs))
	for i, o := range outs {
		t[i] = o.Token
	}
	return t
}
