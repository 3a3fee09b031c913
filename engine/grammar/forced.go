package grammar

import (
	"bytes"
	"unicode/utf8"
)

// Jump-forward decoding (SGLang's compressed FSM): where the grammar
// leaves the output exactly one way to go on — a declared key after
// '{' or ',', the '":' after it, a closing brace, the rest of an enum
// value or of a const — the caller appends those tokens without sampling
// them one forward pass at a time.
//
// The forced bytes are tokenized with the model's tokenizer, and the
// tokens handed out are kept to ones a free sample could also have
// produced: the last token of the run's tokenization is not returned when
// a vocabulary token that begins with it could read on into what the
// grammar allows next (it might merge with the free text that follows,
// the re-tokenization problem SGLang documents: `"name":"` then `J` is
// `":"` + `J` or `":` + `"J`), nor when the run's tokenization ends in a
// token that does not fit; every token returned is allowed by the mask at
// its position; and their bytes are exactly a prefix of the forced run.

// MaxForcedBytes bounds the run of forced bytes ForcedTokens looks at.
const MaxForcedBytes = 64

// Encoder turns text into token ids; *tokenizer.Tokenizer implements it
// (Encode(text, false) adds no special tokens).
type Encoder interface {
	Encode(text string, addSpecial bool) ([]int32, error)
}

// SetEncoder gives the vocabulary the tokenizer that made it, which
// Matcher.ForcedTokens needs. Call it before the vocabulary is shared;
// VocabFromTokenizer does. Without one ForcedTokens returns nothing.
func (v *Vocab) SetEncoder(enc Encoder) { v.enc = enc }

// ForcedTokens returns the tokens the grammar forces next, at most max
// (0: no bound but MaxForcedBytes): the tokenization of the bytes that
// are the only continuation from here, less its last token when a longer
// token could read across the end of the run (or the document ends with
// them, when it is kept). Free whitespace the grammar would allow
// between them is left out. Each token is one the mask would allow at its
// position, so the result is a sequence sampling could also produce. It
// does not advance the matcher: the caller Accepts each token it uses.
// Nothing is forced at a choice, where the document may end, or on a
// vocabulary without an Encoder.
func (m *Matcher) ForcedTokens(max int) []int32 {
	v := m.g.v
	if v.enc == nil || len(m.states) == 0 {
		return nil
	}
	run, done := m.forcedBytes(MaxForcedBytes)
	if !done {
		run = validUTF8Prefix(run)
	}
	if len(run) == 0 {
		return nil
	}
	ids := v.encodeRun(run)
	probe := Matcher{g: m.g, states: m.states, w: walker{g: m.g}}
	off, n := 0, 0
	for _, id := range ids {
		if !v.valid(id) {
			break
		}
		p := v.pieces[id]
		if len(p) == 0 || !bytes.HasPrefix(run[off:], p) || !v.sampleable(id) || probe.Accept(id) != nil {
			break
		}
		off += len(p)
		n++
	}
	if n > 0 && (n < len(ids) || (!done && probe.extends(v.pieces[ids[n-1]]))) {
		n-- // the last token could merge with what follows: sample it
	}
	if max > 0 && n > max {
		n = max
	}
	return ids[:n]
}

// encodeRun tokenizes run, text that follows other text. A SentencePiece
// tokenizer (Llama 2, Mistral) puts a space in front of the text it
// encodes (`{"` becomes `▁{"`), which the run does not have: then the run
// is encoded after a newline, which such tokenizers keep apart (a byte
// token), and the tokens of that space and newline are dropped.
func (v *Vocab) encodeRun(run []byte) []int32 {
	ids, err := v.enc.Encode(string(run), false)
	if err != nil {
		return nil
	}
	if len(ids) == 0 || v.valid(ids[0]) && bytes.HasPrefix(run, v.pieces[ids[0]]) {
		return ids
	}
	anchored, err := v.enc.Encode("\n"+string(run), false)
	if err != nil {
		return ids
	}
	var text []byte
	for _, id := range anchored {
		if !v.valid(id) {
			return ids
		}
		text = append(text, v.pieces[id]...)
	}
	if !bytes.HasSuffix(text, run) {
		return ids
	}
	skip, n := len(text)-len(run), 0
	for k, id := range anchored {
		if n == skip {
			return anchored[k:]
		}
		if n += len(v.pieces[id]); n > skip {
			break // a token spans the newline and the run
		}
	}
	return ids
}

func (v *Vocab) valid(id int32) bool { return id >= 0 && int(id) < v.size }

// extends reports whether a token whose bytes begin with piece, the
// bytes just accepted, and go on with a byte the grammar allows here
// exists: then a free sample could have read across the end of piece.
func (m *Matcher) extends(piece []byte) bool {
	t := &m.g.v.all
	node := t.find(piece)
	if node < 0 {
		return false
	}
	var buf []*stk // heap stacks: at most one is kept before returning
	for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
		for _, s := range m.states {
			if buf = m.w.adv(s, t.edgeByte[e], buf[:0]); len(buf) > 0 {
				return true
			}
		}
	}
	return false
}

// forcedBytes collects up to limit bytes that are each the only byte the
// grammar allows next, skipping free whitespace (which is allowed but
// never forced). done reports that the run ends the document: nothing but
// EOS may follow it.
func (m *Matcher) forcedBytes(limit int) (run []byte, done bool) {
	m.w.pooled = true
	m.w.resetArena()
	defer func() { m.w.pooled = false }()
	cur := m.states
	var buf []*stk
	for len(run) < limit {
		if allRoot(cur) {
			return run, true
		}
		if anyCanEnd(cur) {
			return run, false
		}
		c, ok := m.onlyByte(cur, &buf)
		if !ok {
			return run, false
		}
		var next []*stk
		for _, s := range cur {
			next = m.w.adv(s, c, next)
		}
		if len(next) > maxStacks {
			next = next[:maxStacks]
		}
		run = append(run, c)
		cur = next
	}
	return run, allRoot(cur)
}

// onlyByte returns the one byte that continues states, free whitespace
// aside, if there is exactly one.
func (m *Matcher) onlyByte(states []*stk, buf *[]*stk) (byte, bool) {
	if len(states) == 1 {
		// Inside a literal or a declared key the next byte is known.
		if f := &states[0].f; f.kind == fLit || (f.kind == fObject && f.st == oKey) {
			return f.lit[f.i], true
		}
	}
	var only byte
	n := 0
	for c := 0; c < 256; c++ {
		b := byte(c)
		accepted, free := false, true
		for _, s := range states {
			out := m.w.adv(s, b, (*buf)[:0])
			*buf = out
			if len(out) > 0 {
				accepted = true
				if !isWS(b) || !freeWhitespace(s) {
					free = false
				}
			}
		}
		if !accepted || free {
			continue
		}
		if n++; n > 1 {
			return 0, false
		}
		only = b
	}
	return only, n == 1
}

// freeWhitespace reports whether whitespace read by s is the optional
// kind between JSON tokens, not part of a key or value.
func freeWhitespace(s *stk) bool {
	switch s.f.kind {
	case fValue, fArray:
		return true
	case fObject:
		return s.f.st != oKey
	}
	return false
}

func allRoot(states []*stk) bool {
	for _, s := range states {
		if s.f.kind != fRoot {
			return false
		}
	}
	return len(states) > 0
}

func anyCanEnd(states []*stk) bool {
	for _, s := range states {
		if canEnd(s) {
			return true
		}
	}
	return false
}

// validUTF8Prefix cuts an unfinished UTF-8 character off the end of p.
func validUTF8Prefix(p []byte) []byte {
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return p[:i]
			}
			break
		}
	}
	return p
}

// sampleable reports whether id is one the mask may allow: a token with
// bytes that is neither special nor EOS, found in the vocabulary's trie.
func (v *Vocab) sampleable(id int32) bool {
	t := &v.all
	node := t.find(v.pieces[id])
	if node < 0 {
		return false
	}
	for k := t.tokStart[node]; k < t.tokStart[node+1]; k++ {
		if t.toks[k] == id {
			return true
		}
	}
	return false
}

// find returns the node reached by p from the root, or -1.
func (t *trie) find(p []byte) int32 {
	node := int32(0)
	for _, c := range p {
		next := int32(-1)
		for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
			if t.edgeByte[e] == c {
				next = t.edgeNode[e]
				break
			}
		}
		if next < 0 {
			return -1
		}
		node = next
	}
	return node
}
