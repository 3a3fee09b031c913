package pyproc

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// builder appends one request line (without its newline) for request id.
type builder func(b []byte, id uint64) []byte

// request builds a request from op and its fields with encoding/json; the
// hot path (step) has its own appender.
func request(op string, fields map[string]any) builder {
	return func(b []byte, id uint64) []byte {
		b = append(b, `{"id":`...)
		b = strconv.AppendUint(b, id, 10)
		b = append(b, `,"op":`...)
		b = strconv.AppendQuote(b, op)
		for k, v := range fields {
			js, err := json.Marshal(v)
			if err != nil {
				js = []byte("null") // fields are plain values; never happens
			}
			b = append(b, ',')
			b = strconv.AppendQuote(b, k)
			b = append(b, ':')
			b = append(b, js...)
		}
		return append(b, '}')
	}
}

// call sends one request and waits for its reply. A reply with ok false
// comes back as an error mapped by toError.
func (p *proc) call(ctx context.Context, model string, build builder) (*reply, error) {
	id, ch, err := p.send(build, true)
	if err != nil {
		return nil, err
	}
	return p.wait(ctx, model, id, ch)
}

// send writes a request. With wait false nobody waits for the reply, which
// the reader then drops.
func (p *proc) send(build builder, wait bool) (uint64, chan *reply, error) {
	id := p.nextID.Add(1)
	var ch chan *reply
	if wait {
		ch = make(chan *reply, 1)
		p.pmu.Lock()
		if p.pending == nil {
			p.pmu.Unlock()
			return 0, nil, p.lost()
		}
		p.pending[id] = ch
		p.pmu.Unlock()
	}
	p.wmu.Lock()
	p.wbuf = build(p.wbuf[:0], id)
	if len(p.wbuf) > p.maxLine {
		n := len(p.wbuf)
		p.wmu.Unlock()
		p.forget(id)
		return 0, nil, &engine.InvalidParamError{Param: "tokens",
			Reason: fmt.Sprintf("the request takes %d bytes, over the worker protocol's line limit of %d", n, p.maxLine)}
	}
	p.wbuf = append(p.wbuf, '\n')
	_, err := p.stdin.Write(p.wbuf)
	p.wmu.Unlock()
	if err != nil {
		p.forget(id)
		p.fail("writing a request: " + err.Error())
		return 0, nil, p.lost()
	}
	return id, ch, nil
}

func (p *proc) forget(id uint64) {
	p.pmu.Lock()
	if p.pending != nil {
		delete(p.pending, id)
	}
	p.pmu.Unlock()
}

func (p *proc) wait(ctx context.Context, model string, id uint64, ch chan *reply) (*reply, error) {
	var r *reply
	select {
	case r = <-ch:
	case <-p.dead:
		select {
		case r = <-ch:
		default:
			return nil, p.lost()
		}
	case <-ctx.Done():
		p.forget(id)
		return nil, ctx.Err()
	}
	if !r.OK {
		if r.Error == nil {
			return nil, &WorkerError{Code: retry.CodeInternal, Message: "error reply without an error"}
		}
		return nil, r.Error.toError(model)
	}
	return r, nil
}

// appendStep encodes a step request by hand: it runs every decode step.
// plan (nil: every input as given, one token) says what each input sends;
// a Prev input's tokens go as null. after, when not 0, is the step
// request this one was sent behind, and "opening" lists the sequences of
// Opening inputs (PROTOCOL.md, "Pipelined steps").
func appendStep(b []byte, id uint64, model string, vocab int, batch []engine.StepInput, plan []inPlan, idx []int, after uint64) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, id, 10)
	b = append(b, `,"op":"step","model":`...)
	b = strconv.AppendQuote(b, model)
	if after != 0 {
		b = append(b, `,"after":`...)
		b = strconv.AppendUint(b, after, 10)
	}
	b = appendOpening(b, batch, idx)
	b = appendLast(b, batch, idx)
	b = append(b, `,"batch":[`...)
	for n, i := range idx {
		in := &batch[i]
		if n > 0 {
			b = append(b, ',')
		}
		toks, n, back := in.Tokens, 1, 0
		if plan != nil {
			toks, n, back = plan[i].send, plan[i].n, plan[i].back
		}
		b = append(b, '[')
		b = strconv.AppendUint(b, uint64(in.Seq), 10)
		if in.Prev {
			b = append(b, ",null,"...)
		} else {
			b = append(b, ",["...)
			for j, t := range toks {
				if j > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendInt(b, int64(t), 10)
			}
			b = append(b, "],"...)
		}
		b = strconv.AppendBool(b, in.Sample)
		b = append(b, ',')
		var loop []uint64
		steps := 0
		if n > 1 && in.Allowed != nil {
			loop, steps = in.Loop, n-1
		}
		if plan != nil && plan[i].pooled { // pooling takes no sampling parameters
			b = append(b, "{}"...)
		} else {
			b = appendParams(b, in.Params, in.Sample, in.Allowed, vocab)
		}
		if loop != nil {
			b = appendLoop(b[:len(b)-1], loop, steps, vocab)
		}
		if n > 1 || back > 0 {
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(n), 10)
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(back), 10)
		}
		b = append(b, ']')
	}
	return append(b, "]}"...)
}

// appendOpening writes "opening", the sequences of the Opening inputs
// among batch's inputs idx, when there are any.
func appendOpening(b []byte, batch []engine.StepInput, idx []int) []byte {
	return appendSeqs(b, `,"opening":[`, batch, idx, func(in *engine.StepInput) bool { return in.Opening })
}

// appendLast writes "last", the sequences of the inputs among idx whose
// sample is their last (engine.StepInput.Last), when there are any: the
// worker speculates no decode step of theirs.
func appendLast(b []byte, batch []engine.StepInput, idx []int) []byte {
	return appendSeqs(b, `,"last":[`, batch, idx, func(in *engine.StepInput) bool { return in.Last && in.Sample })
}

// appendSeqs writes key (a member's opening, through its "[") and the
// sequences of the inputs among idx for which has is true, closing the
// list; nothing when there are none.
func appendSeqs(b []byte, key string, batch []engine.StepInput, idx []int, has func(*engine.StepInput) bool) []byte {
	first := true
	for _, i := range idx {
		if !has(&batch[i]) {
			continue
		}
		if first {
			b = append(b, key...)
		} else {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendUint(b, uint64(batch[i].Seq), 10)
	}
	if first {
		return b
	}
	return append(b, ']')
}

// paramKeys are the keys appendParams and appendLoop write. The worker
// lists the keys of its runtime's table in its handshake (capabilities
// "params": every key the runtime parses, whichever features its backend
// serves), and a worker whose table lacks one of these — a runtime and a
// supervisor out of step — is refused at start.
var paramKeys = []string{"t", "p", "k", "m", "r", "s", "l", "n", "pp", "fp", "g", "lb", "x", "lp", "ls"}

// unreadParams returns the keys of paramKeys that the handshake's
// capabilities do not list as read.
func unreadParams(caps map[string]any) []string {
	read := map[string]bool{}
	if list, ok := caps["params"].([]any); ok {
		for _, k := range list {
			if s, ok := k.(string); ok {
				read[s] = true
			}
		}
	}
	var missing []string
	for _, k := range paramKeys {
		if !read[k] {
			missing = append(missing, k)
		}
	}
	return missing
}

// appendParams writes the compact sampling object PROTOCOL.md describes;
// zero fields are left out.
func appendParams(b []byte, p *engine.SamplingParams, sample bool, allowed []uint64, vocab int) []byte {
	if !sample {
		return append(b, "{}"...)
	}
	if p == nil {
		p = &engine.SamplingParams{} // greedy; the mask still applies
	}
	b = append(b, '{')
	first := true
	f := func(k string, v float32) {
		if v == 0 || math.IsNaN(float64(v)) {
			return
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, k...)
		b = strconv.AppendFloat(b, float64(v), 'g', -1, 32)
	}
	f(`"t":`, p.Temperature)
	f(`"p":`, p.TopP)
	f(`"k":`, float32(p.TopK))
	f(`"m":`, p.MinP)
	f(`"r":`, p.RepetitionPenalty)
	if p.HasSeed {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, `"s":`...)
		b = strconv.AppendUint(b, p.Seed, 10)
	}
	if p.Logprobs {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, `"l":true`...)
	}
	f(`"n":`, float32(p.TopLogprobs))
	f(`"pp":`, p.PresencePenalty)
	f(`"fp":`, p.FrequencyPenalty)
	if p.Generated > 0 {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, `"g":`...)
		b = strconv.AppendInt(b, int64(p.Generated), 10)
	}
	if len(p.LogitBias) > 0 {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendBias(b, p.LogitBias)
	}
	if allowed != nil {
		if !first {
			b = append(b, ',')
		}
		b = appendMask(b, allowed, vocab)
	}
	return append(b, '}')
}

// appendBias writes "lb":[[id,bias],...] in id order.
func appendBias(b []byte, bias map[int32]float32) []byte {
	ids := make([]int32, 0, len(bias))
	for id := range bias {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b = append(b, `"lb":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, int64(id), 10)
		b = append(b, ',')
		b = strconv.AppendFloat(b, float64(bias[id]), 'g', -1, 32)
		b = append(b, ']')
	}
	return append(b, ']')
}

// appendLoop ends a params object that holds a mask with the loop of a
// constrained input decoded ahead (PROTOCOL.md, "Lookahead"): "lp" its
// tokens in a mask's form and "ls" how many tokens ahead it holds for.
func appendLoop(b []byte, loop []uint64, steps, vocab int) []byte {
	b = append(b, ',')
	b = appendTokenSet(b, `"lp":`, loop, vocab)
	b = append(b, `,"ls":`...)
	b = strconv.AppendInt(b, int64(steps), 10)
	return append(b, '}')
}

// appendMask writes the step's allowed-token mask as "x", in the smallest
// of three forms (PROTOCOL.md): the allowed ids ("a"), the disallowed ids
// ("d", with "v" the vocabulary size), or the bitset in base64 ("b").
func appendMask(b []byte, mask []uint64, vocab int) []byte {
	return appendTokenSet(b, `"x":`, mask, vocab)
}

// appendTokenSet writes key (with its quotes and colon) and the token set
// in mask in the smallest of appendMask's forms.
func appendTokenSet(b []byte, key string, mask []uint64, vocab int) []byte {
	words := engine.MaskWords(vocab)
	allowed := 0
	for i, w := range mask[:words] {
		if i == words-1 && vocab%64 != 0 {
			w &= 1<<(vocab%64) - 1
		}
		allowed += bits.OnesCount64(w)
	}
	const idBytes = 7 // a typical id and its comma
	bitset := (vocab/8 + 2) * 4 / 3
	switch {
	case allowed*idBytes <= bitset:
		b = append(append(b, key...), `{"a":[`...)
		return append(appendIDs(b, mask, vocab, true), '}')
	case (vocab-allowed)*idBytes <= bitset:
		b = append(append(b, key...), `{"d":[`...)
		b = appendIDs(b, mask, vocab, false)
		b = append(b, `,"v":`...)
		return append(strconv.AppendInt(b, int64(vocab), 10), '}')
	}
	raw := make([]byte, 8*words)
	for i, w := range mask[:words] {
		binary.LittleEndian.PutUint64(raw[8*i:], w)
	}
	raw = raw[:(vocab+7)/8]
	if vocab%8 != 0 {
		raw[len(raw)-1] &= 1<<(vocab%8) - 1
	}
	b = append(append(b, key...), `{"b":"`...)
	b = base64.StdEncoding.AppendEncode(b, raw)
	return append(b, `"}`...)
}

// appendIDs writes the ids below vocab whose bit equals set, then "]".
func appendIDs(b []byte, mask []uint64, vocab int, set bool) []byte {
	first := true
	for i := 0; i < engine.MaskWords(vocab); i++ {
		w := mask[i]
		if !set {
			w = ^w
		}
		for w != 0 {
			id := i*64 + bits.TrailingZeros64(w)
			w &= w - 1
			if id >= vocab {
				break
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = strconv.AppendInt(b, int64(id), 10)
		}
	}
	return append(b, ']')
}
