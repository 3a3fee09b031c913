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

// WithGrammarLimits sets the bounds within which constrained output
// (Params.JSONSchema, forced tool calls) is generated: free whitespace,
// the length of strings without maxLength, array and object sizes, depth,
// number digits (see grammar.Limits). Zero fields keep the defaults, which
// let even a random-weight model finish a document in a few hundred
// tokens; raise MaxStringLength for long free-text fields.
func WithGrammarLimits(l grammar.Limits) Option {
	return func(c *config) error {
		if err := l.Validate(); err != nil {
			return err
		}
		c.grammarLimits = l
		return nil
	}
}

// constraint compiles schema against m's vocabulary (compiled grammars
// are cached per vocabulary) and starts a matcher for one sequence.
func (m *model) constraint(schema []byte, lim grammar.Limits) (*grammar.Matcher, error) {
	if m.tok == nil {
		return nil, fmt.Errorf("%w: constrained output needs model %q's tokenizer", ErrNoTokenizer, m.info.ID)
	}
	m.vocab.once.Do(func() {
		m.vocab.v = grammar.VocabFromTokenizer(m.tok, m.info.VocabSize, slices.Concat(m.info.EOS, m.eos)...)
	})
	g, err := m.vocab.v.Compile(schema, lim)
	if err != nil {
		return nil, &engine.InvalidParamError{Param: "json_schema", Reason: err.Error()}
	}
	return g.NewMatcher(), nil
}

// fitBudget refuses constrained output whose shortest document takes more
// than maxTokens: an *engine.InvalidParamError naming max_tokens that
// wraps a *grammar.BudgetError with the minimum.
func fitBudget(c *grammar.Matcher, maxTokens int) error {
	err := c.Grammar().CheckBudget(maxTokens)
	if err == nil {
		return nil
	}
	be := err.(*grammar.BudgetError)
	return &engine.InvalidParamError{
		Param:  "max_tokens",
		Reason: fmt.Sprintf("%d is too small for the response's schema: its shortest document takes %d tokens", maxTokens, be.MinTokens),
		Err:    be,
	}
}
