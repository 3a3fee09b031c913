package mlxserving

import (
	"fmt"
	"slices"
	"sync"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/grammar"
)

// vocabOnce builds a model's grammar vocabulary on first use: it takes
// a moment on large vocabularies and most models never need it.
type vocabOnce struct {
	once sync.Once
	v    *grammar.Vocab
}

// constraint compiles schema against m's vocabulary (compiled grammars
// are cached per vocabulary) and starts a matcher for one sequence.
func (m *model) constraint(schema []byte) (*grammar.Matcher, error) {
	if m.tok == nil {
		return nil, fmt.Errorf("%w: constrained output needs model %q's tokenizer", ErrNoTokenizer, m.info.ID)
	}
	m.vocab.once.Do(func() {
		pieces := make([][]byte, m.info.VocabSize)
		for id := range pieces {
			pieces[id] = m.tok.TokenBytes(int32(id))
		}
		eos := slices.Concat(m.info.EOS, m.eos, m.tok.EOS())
		m.vocab.v = grammar.NewVocab(pieces, eos, m.tok.IsSpecial)
	})
	g, err := m.vocab.v.Compile(schema, grammar.Limits{})
	if err != nil {
		return nil, &engine.InvalidParamError{Param: "json_schema", Reason: err.Error()}
	}
	return g.NewMatcher(), nil
}
