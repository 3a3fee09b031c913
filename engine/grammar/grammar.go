package grammar

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/internal/lru"
)

// Grammar is a compiled schema bound to a vocabulary. It is safe for
// concurrent use; each generated sequence follows it with its own Matcher.
type Grammar struct {
	v    *Vocab
	root *node
	lim  Limits
	// warm is set once every pattern under root is warm.
	warm atomic.Bool
	nums numCache // digit tokens of the states of numbers with bounds
	// closes caches closing runs by state (close.go); open is the
	// margin FillMaskWithin keeps (budget.go).
	closes *lru.Shared[string, closeRun]
	texts  *lru.Shared[string, closeText]
	open   openMargin
	reNext sync.Map // *dstate -> the ASCII byte (int) that takes it closest to a match; -1: none
}

// AnyObject is the schema of OpenAI's response_format json_object: any
// JSON object.
var AnyObject = []byte(`{"type":"object"}`)

// Compile compiles a JSON schema against the vocabulary, or returns the
// grammar compiled before for the same schema text and limits. Errors are
// an *UnsupportedError (wrapping ErrUnsupported) naming a keyword that
// cannot be enforced, or a *SchemaError (wrapping ErrBadSchema).
//
// Compiling a pattern or format on a vocabulary computes the tokens each
// of its states allows (warm.go), so that generated tokens do not wait
// for them: milliseconds for a uuid or a date, a second or two for an
// email or hostname on a 128k vocabulary. A call spends at most 50 ms on
// it; the calls that follow for the same schema go on where it stopped
// until every state is warm. It also finds the digit tokens that may
// start each number with bounds (up to about 0.2 ms each on Llama 3).
func (v *Vocab) Compile(schema []byte, lim Limits) (*Grammar, error) {
	lim, err := lim.withDefaults()
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("%v\x00%s", lim, schema)
	if g, ok := v.cache.Get(key); ok {
		if !g.warm.Load() && v.warm(g.root, time.Now().Add(compileWarmBudget)) {
			g.warm.Store(true)
		}
		return g, nil
	}
	doc, err := decodeSchema(schema)
	if err != nil {
		return nil, err
	}
	c := &compiler{root: doc, lim: lim, refs: map[string]*node{}, regexes: v.regexes}
	root, err := c.compile(doc, "")
	if err != nil {
		return nil, err
	}
	g := &Grammar{v: v, root: root, lim: lim}
	g.closes = lru.NewShared[string, closeRun](closeCacheSize)
	g.texts = lru.NewShared[string, closeText](closeCacheSize)
	g.warmNumbers()
	g.warm.Store(v.warm(root, time.Now().Add(compileWarmBudget)))
	v.cache.Add(key, g)
	return g, nil
}

// Check reports whether Compile would accept schema, without a
// vocabulary: nil, an *UnsupportedError or a *SchemaError.
func Check(schema []byte) error {
	doc, err := decodeSchema(schema)
	if err != nil {
		return err
	}
	c := &compiler{root: doc, lim: Limits{}, refs: map[string]*node{}}
	if c.lim, err = c.lim.withDefaults(); err != nil {
		return err
	}
	_, err = c.compile(doc, "")
	return err
}

// CompileValue is Compile for a schema held as a decoded JSON value.
func (v *Vocab) CompileValue(schema any, lim Limits) (*Grammar, error) {
	b, err := json.Marshal(schema)
	if err != nil {
		return nil, &SchemaError{Reason: err.Error()}
	}
	return v.Compile(b, lim)
}

// Grammar returns the grammar the matcher follows.
func (m *Matcher) Grammar() *Grammar { return m.g }

// Vocab returns the vocabulary the grammar was compiled against.
func (g *Grammar) Vocab() *Vocab { return g.v }

// maxStacks caps the readings a matcher follows at once; more only arise
// from anyOf alternatives sharing long prefixes.
const maxStacks = 64

// Matcher follows one generated sequence through a grammar. It is not
// safe for concurrent use. Make one with Grammar.NewMatcher.
type Matcher struct {
	g      *Grammar
	states []*stk
	w      walker
	bufs   [][]*stk
	cbufs  [][]*stk
	filter []uint64 // closers allowed by a pattern; nil: all
	free   int      // tokens accepted inside free-form values
	numBuf []frame  // digitMask's scratch
	// plan is the closing run of the current state when planSet
	// (budget.go); keyBuf is scratch for its cache keys.
	plan    closeRun
	planSet bool
	keyBuf  []byte
	// est is the closing distance last looked up and the tokens accepted
	// since (FillMaskWithin).
	est struct {
		set      bool
		d, since int
	}
}

// NewMatcher starts matching a document from its first byte.
func (g *Grammar) NewMatcher() *Matcher {
	root := &stk{f: frame{kind: fRoot}}
	m := &Matcher{g: g, w: walker{g: g}}
	m.states = []*stk{{f: frame{kind: fValue, n: g.root}, up: root}}
	return m
}

// Done reports whether the document is complete and nothing but EOS may
// follow. A generator may stop here without sampling EOS.
func (m *Matcher) Done() bool {
	for _, s := range m.states {
		if s.f.kind != fRoot {
			return false
		}
	}
	return true
}

// CanEnd reports whether the document is complete (EOS is allowed), even
// if it could also go on (a number may take more digits).
func (m *Matcher) CanEnd() bool {
	for _, s := range m.states {
		if canEnd(s) {
			return true
		}
	}
	return false
}

// Dead reports whether no token can follow: only possible when limits or
// bounds leave no completion (the output so far is a valid prefix).
func (m *Matcher) Dead() bool { return len(m.states) == 0 }

// Accept advances the matcher with token id's bytes. A token the mask
// did not allow returns ErrRejected and leaves the matcher unchanged. EOS
// is accepted when CanEnd.
func (m *Matcher) Accept(id int32) error {
	v := m.g.v
	if !v.valid(id) {
		return fmt.Errorf("%w: id %d outside the vocabulary", ErrRejected, id)
	}
	if isEOS(v.eos, id) {
		if !m.CanEnd() {
			return fmt.Errorf("%w: EOS before the document is complete", ErrRejected)
		}
		m.states = m.states[:1]
		m.states[0] = &stk{f: frame{kind: fRoot}}
		m.planSet = false
		return nil
	}
	p := v.pieces[id]
	if len(p) == 0 {
		return fmt.Errorf("%w: token %d has no text", ErrRejected, id)
	}
	m.w.pooled = false
	m.setClosing()
	inFree := false
	for _, s := range m.states {
		inFree = inFree || freeForm(s)
	}
	cur := m.states
	for _, c := range p {
		var next []*stk
		for _, s := range cur {
			next = m.w.adv(s, c, next)
			if len(next) > maxStacks {
				next = next[:maxStacks]
			}
		}
		if len(next) == 0 {
			return fmt.Errorf("%w: token %d (%q)", ErrRejected, id, p)
		}
		cur = next
	}
	m.states = cur
	if inFree {
		m.free++
	}
	m.est.since++
	m.followPlan(id)
	return nil
}

// setClosing tells the walker whether the document spent its free-form
// budget (Limits.MaxFreeTokens).
func (m *Matcher) setClosing() { m.w.closing = m.free >= m.g.lim.MaxFreeTokens }

// AcceptBytes advances the matcher with raw bytes, for text forced into
// the output outside sampling. It returns ErrRejected, leaving the matcher
// unchanged, if the bytes cannot continue the document.
func (m *Matcher) AcceptBytes(p []byte) error {
	m.w.pooled = false
	m.setClosing()
	cur := m.states
	for _, c := range p {
		var next []*stk
		for _, s := range cur {
			next = m.w.adv(s, c, next)
		}
		if len(next) == 0 {
			return fmt.Errorf("%w: bytes %q", ErrRejected, p)
		}
		cur = next
	}
	m.states = cur
	m.planSet = false
	m.est.since += len(p)
	return nil
}
