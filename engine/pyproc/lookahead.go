package pyproc

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Lookahead: a decode step asks the worker for up to k tokens per
// sequence instead of one (PROTOCOL.md, "Lookahead"). The worker keeps
// decoding on its own, feeding each sequence the token it just sampled;
// Step hands the extra tokens out one per call while the caller feeds
// back exactly the tokens it was given, so k tokens cost one round trip.
// A caller that feeds something else (or a prompt chunk) rolls the
// sequence back first: the worker drops the tokens it fed ahead. Stop
// conditions stay the caller's: a sequence freed early wastes at most k-1
// decoded tokens.
//
// A constrained input (Allowed set) decodes ahead only when it carries a
// loop (StepInput.Loop): the worker samples the next tokens under the
// same mask while each token it samples is in the loop, and stops after
// the first one outside it. The buffered tokens remember that mask and
// are served only to a step whose Allowed equals it.

// defaultLookaheadCUDA is the lookahead used on CUDA when WithLookahead
// leaves the choice to the engine. On the CPU it is 1 (off): there a
// token's compute dwarfs the round trip, and wasted tokens cost real time.
const defaultLookaheadCUDA = 8

// maxLookahead bounds WithLookahead; the worker clips at the same value.
const maxLookahead = 64

// lookaheadMaxBatch is the largest step that asks for tokens ahead. Larger
// batches keep the GPU busy without it, and a chain of decode steps holds
// back the prompts waiting for the next step: on an H100 (1B shape,
// 1,260-token prompts) lookahead 8 against none served 62.7 against 71.0
// req/s at 256 clients and TTFT p99 642 against 515 ms at 64, while a lone
// sequence decodes fastest with it.
const lookaheadMaxBatch = 32

// loopAdapt sets how far constrained inputs decode ahead from how far
// that got before: a step is answered from the buffers only when every
// input has a token there, and among several constrained sequences one
// usually leaves its loop within a token or two, after which the tokens
// decoded ahead cost forward passes and save no round trip.
type loopAdapt struct {
	run    float64 // running mean of the steps answered wholly from buffers after a round that decoded constrained inputs ahead
	served int     // such steps since the last round
	asked  bool    // the last round decoded constrained inputs ahead
	rounds int     // rounds since the last probe, while run is under one step
	gap    int     // rounds between probes: firstProbeGap, doubled after each probe that did not pay
}

// firstProbeGap and maxProbeGap bound the rounds between probes of 2
// tokens while constrained inputs' loops do not pay. A probe that does
// not pay costs a forward pass nobody uses; on an H100 (1B shape,
// documents whose strings end at once) a probe every 8th round cost a
// tenth of a lone sequence's throughput, so the gap doubles after each
// failed probe.
const (
	firstProbeGap = 8
	maxProbeGap   = 256
)

// limit is called once per round to the worker: it folds in how the
// previous round went and returns how many tokens a constrained input
// may ask for in this one (at most k). Under a step per round it asks
// for one only, except for a probe of 2 after firstProbeGap rounds, then
// twice as many after each probe that did not pay (up to maxProbeGap), to
// see whether the batch's loops got longer.
func (l *loopAdapt) limit(k int) int {
	if l.asked {
		l.run = 0.5*l.run + 0.5*float64(l.served)
	}
	l.asked, l.served = false, 0
	n := min(k, 1+int(1.5*l.run+0.5))
	if n > 1 {
		l.rounds, l.gap = 0, firstProbeGap
		return n
	}
	l.gap = max(l.gap, firstProbeGap)
	if l.rounds++; l.rounds >= l.gap {
		l.rounds, l.gap = 0, min(2*l.gap, maxProbeGap)
		return min(k, 2)
	}
	return 1
}

// ahead is one sequence's lookahead state.
type ahead struct {
	last int32               // the token Step returned last
	has  bool                // last is set
	buf  []engine.StepOutput // tokens decoded ahead, not yet returned
	// mask is the allowed mask buf was decoded under, when masked.
	mask   []uint64
	masked bool
}

// inPlan says how one input of a Step goes to the worker.
type inPlan struct {
	send   []int32 // tokens to send; nil: not sent this step
	n      int     // tokens the worker decodes for it (1: just this step)
	back   int     // tokens the worker drops before feeding send
	served bool    // the output comes from the lookahead buffer
	pooled bool    // an embedding sequence's input: never decoded ahead
}

// lookaheadFor resolves the configured lookahead for a model loaded on
// device with workers whose handshakes are hellos.
func lookaheadFor(configured int, device string, hellos []reply) int {
	k := configured
	if k == 0 {
		k = 1
		if strings.HasPrefix(device, "cuda") {
			k = defaultLookaheadCUDA
		}
	}
	if k <= 1 {
		return 1
	}
	for _, h := range hellos {
		if on, _ := h.Caps["lookahead"].(bool); !on {
			return 1
		}
	}
	return k
}

// canLookahead reports whether a sampling input's tokens may be decoded
// ahead: not with a per-step allowed-token mask unless it carries a loop
// (otherwise the caller computes the next mask from the token it is
// given), nor with parameters applied on the host from the sequence's
// tokens or returned per token beside it (penalties, logit bias, top
// log-probabilities). The worker applies the same rule
// (lookahead.allowed).
func canLookahead(in *engine.StepInput) bool {
	return (in.Allowed == nil || in.LoopSteps > 0) && plainParams(in.Params)
}

// plainParams reports whether sampling with p depends on nothing the
// caller does between tokens.
func plainParams(p *engine.SamplingParams) bool {
	return p == nil || ((p.RepetitionPenalty == 0 || p.RepetitionPenalty == 1) && !p.Adjusts() && p.TopLogprobs == 0)
}

// aheadFor is the number of tokens a one-token sampling input asks the
// worker for with lookahead k: k, or for a constrained input at most
// masked (loopAdapt.limit) and its loop's steps and one.
func aheadFor(in *engine.StepInput, k, masked int) int {
	if in.Allowed != nil {
		return min(k, masked, in.LoopSteps+1)
	}
	return k
}

// servable reports whether input in can take its output from the
// sequence's lookahead buffer: it feeds the token it was given last, and
// its mask is the one the buffer was decoded under (both nil, or equal
// word for word: a caller may refill the same slice, so its address
// proves nothing).
func servable(in *engine.StepInput, st *ahead) bool {
	if st == nil || len(st.buf) == 0 || !st.has || !in.Sample || len(in.Tokens) != 1 ||
		in.Tokens[0] != st.last || !plainParams(in.Params) {
		return false
	}
	if in.Allowed == nil || !st.masked {
		return in.Allowed == nil && !st.masked
	}
	return slices.Equal(in.Allowed[:len(st.mask)], st.mask)
}

// fromBuffers answers the whole step from the lookahead buffers, or
// returns nil when some input needs the worker.
func (m *Model) fromBuffers(batch []engine.StepInput) []engine.StepOutput {
	for i := range batch {
		if !servable(&batch[i], m.look[batch[i].Seq]) || !m.seqs[batch[i].Seq].proc.alive() {
			return nil
		}
	}
	outs := make([]engine.StepOutput, len(batch))
	for i := range batch {
		st := m.look[batch[i].Seq]
		outs[i] = st.pop()
	}
	if m.loops.asked {
		m.loops.served++
	}
	return outs
}

func (st *ahead) pop() engine.StepOutput {
	o := st.buf[0]
	copy(st.buf, st.buf[1:])
	st.buf = st.buf[:len(st.buf)-1]
	st.last, st.has = o.Token, true
	return o
}

// planStep decides, per input, what goes to the worker: inputs served
// from their buffer are topped up to k-1 buffered tokens (or not sent when
// already full); others are sent as given, rolled back first when they
// had tokens buffered, and ask for k tokens when they decode one token.
func (m *Model) planStep(batch []engine.StepInput, plan []inPlan) []inPlan {
	k := m.k
	if len(batch) > lookaheadMaxBatch {
		k = 1 // buffered tokens are still served
	}
	masked := 0
	if k > 1 {
		masked = m.loops.limit(k)
	}
	for i := range batch {
		in := &batch[i]
		st := m.look[in.Seq]
		var p inPlan
		switch {
		case m.k > 1 && servable(in, st):
			p.served = true
			// A masked buffer is not topped up: whether the mask holds
			// after its last token is the caller's to say.
			// Nor is the buffer of a sequence at its last token.
			if n := k - len(st.buf); n >= 1 && !st.masked && !in.Last {
				p.send, p.n = []int32{st.buf[len(st.buf)-1].Token}, n
			}
		case m.pooled[in.Seq] != nil:
			p.send, p.n, p.pooled = in.Tokens, 1, true
		case in.Prev: // never decoded ahead: StepAsync runs with k 1 only
			p.send, p.n = prevRow, 1
		default:
			p.send, p.n = in.Tokens, 1
			if st != nil {
				// Dropped by absorb once the step succeeded: a step the
				// worker refuses (out of blocks) changes no sequence.
				p.back = len(st.buf)
			}
			// A prompt chunk samples just its first token, so lookahead
			// never delays time to first token; decoding ahead starts
			// with the next step.
			if k > 1 && in.Sample && len(in.Tokens) == 1 && canLookahead(in) {
				p.n = aheadFor(in, k, masked)
			}
		}
		plan = append(plan, p)
	}
	ahead := plan[len(plan)-len(batch):]
	lastOnly(batch, ahead)
	for i := range ahead {
		m.loops.asked = m.loops.asked || (batch[i].Allowed != nil && ahead[i].n > 1 && !ahead[i].served)
	}
	return plan
}

// lastOnly asks nothing ahead of a step whose every input decoding
// ahead samples its sequence's last token (engine.StepInput.Last): their
// tokens past this one would be thrown away. Where another input decodes
// ahead, they keep their n: the worker's chain runs its rows in lockstep,
// so a row stopped early saves nothing there, and a chain of rows of
// unequal lengths has no next step speculated behind it.
func lastOnly(batch []engine.StepInput, plan []inPlan) {
	for i := range plan { // a buffer topped up decodes ahead too
		if plan[i].n > 1 && !batch[i].Last {
			return
		}
	}
	for i := range plan {
		plan[i].n = min(plan[i].n, 1)
	}
}

// prevRow is the send of a Prev input's plan: sent, its token left to the
// worker (a null row).
var prevRow = []int32{}

// absorb records input i's reply: the step's token k and the tokens
// decoded after it; it returns the output Step hands back for the input.
func (m *Model) absorb(in *engine.StepInput, p *inPlan, r *reply, k int) (engine.StepOutput, error) {
	st := m.look[in.Seq]
	if _, open := m.seqs[in.Seq]; st == nil && m.k > 1 && open { // a sequence freed while its step was out keeps none
		st = &ahead{}
		m.look[in.Seq] = st
	}
	var got []engine.StepOutput
	if p.send != nil {
		if k >= len(r.Tokens) {
			return engine.StepOutput{}, &WorkerError{Code: retry.CodeInternal, Message: fmt.Sprintf("step reply has %d tokens, want more", len(r.Tokens))}
		}
		o := engine.StepOutput{Seq: in.Seq, Token: r.Tokens[k]}
		if k < len(r.Logprobs) {
			o.Logprob = r.Logprobs[k]
		}
		if k < len(r.Top) && len(r.Top[k]) > 0 { // never with lookahead: canLookahead
			o.Top = make([]engine.TokenLogprob, len(r.Top[k]))
			for j, e := range r.Top[k] {
				o.Top[j] = engine.TokenLogprob{Token: int32(e[0]), Logprob: float32(e[1])}
			}
		}
		got = append(got, o)
		if k < len(r.More) {
			if len(r.More[k]) >= p.n {
				return engine.StepOutput{}, &WorkerError{Code: retry.CodeInternal, Message: fmt.Sprintf("step reply has %d tokens ahead, asked for %d", len(r.More[k]), p.n-1)}
			}
			for j, t := range r.More[k] {
				o := engine.StepOutput{Seq: in.Seq, Token: t}
				if k < len(r.MoreLogprobs) && j < len(r.MoreLogprobs[k]) {
					o.Logprob = r.MoreLogprobs[k][j]
				}
				got = append(got, o)
			}
		}
	}
	if st == nil { // lookahead off: exactly the step's token
		return got[0], nil
	}
	if p.served {
		o := st.pop()
		st.buf = append(st.buf, got...)
		return o, nil
	}
	st.buf = append(st.buf[:0], got...)
	st.masked = in.Allowed != nil
	if st.masked {
		st.mask = append(st.mask[:0], in.Allowed[:engine.MaskWords(m.info.VocabSize)]...)
	}
	return st.pop(), nil
}
