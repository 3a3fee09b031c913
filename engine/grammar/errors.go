package grammar

import (
	"errors"
	"fmt"
)

var (
	// ErrUnsupported means the schema uses a keyword or value the grammar
	// cannot enforce. An *UnsupportedError names it.
	ErrUnsupported = errors.New("unsupported JSON schema feature")
	// ErrBadSchema means the schema is not a valid JSON schema document.
	ErrBadSchema = errors.New("invalid JSON schema")
	// ErrRejected means Accept was given a token the matcher does not allow.
	ErrRejected = errors.New("token not allowed by the grammar")
)

// UnsupportedError names a schema keyword that cannot be enforced.
type UnsupportedError struct {
	// Keyword is the JSON schema keyword, e.g. "patternProperties", or a
	// keyword and value, e.g. "format: ipv6".
	Keyword string
	// Path is the JSON pointer of the schema object holding it.
	Path string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("unsupported JSON schema keyword %q at %s", e.Keyword, pathOrRoot(e.Path))
}

// Unwrap returns ErrUnsupported.
func (e *UnsupportedError) Unwrap() error { return ErrUnsupported }

// SchemaError says why a schema is malformed.
type SchemaError struct {
	// Path is the JSON pointer of the offending schema object.
	Path string
	// Reason explains the problem.
	Reason string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("invalid JSON schema at %s: %s", pathOrRoot(e.Path), e.Reason)
}

// Unwrap returns ErrBadSchema.
func (e *SchemaError) Unwrap() error { return ErrBadSchema }

func pathOrRoot(p string) string {
	if p == "" {
		return "#"
	}
	return "#" + p
}

// ErrBudget means a token budget is smaller than the shortest document of
// a grammar. A *BudgetError says by how much.
var ErrBudget = errors.New("token budget too small for the schema's shortest document")

// BudgetError refuses a budget below a grammar's MinTokens.
type BudgetError struct {
	// MinTokens is the fewest tokens a document of the schema takes.
	MinTokens int
	// Budget is the budget refused.
	Budget int
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("the schema's shortest document takes %d tokens, more than the %d allowed", e.MinTokens, e.Budget)
}

// Unwrap returns ErrBudget.
func (e *BudgetError) Unwrap() error { return ErrBudget }

// CheckBudget returns a *BudgetError when the grammar's shortest document
// takes more than budget tokens, and nil otherwise (or when MinTokens is
// unknown).
func (g *Grammar) CheckBudget(budget int) error {
	if lo := g.MinTokens(); lo > budget {
		return &BudgetError{MinTokens: lo, Budget: budget}
	}
	return nil
}
