package session

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// MaxIDLength is the longest session id accepted, in bytes.
const MaxIDLength = 128

// ErrInvalidID means a session id is empty, too long, not UTF-8 or holds
// control characters. The error also matches engine.ErrInvalidParam, so
// the HTTP layer answers 400.
var ErrInvalidID = retry.NewError(retry.CodeInvalidValue, "invalid session id")

// ErrClosed is returned by a Registry after Close.
var ErrClosed = fmt.Errorf("session registry: %w", engine.ErrClosed)

// InvalidIDError says why a session id was refused.
type InvalidIDError struct {
	// ID is the refused id, cut to MaxIDLength bytes.
	ID string
	// Reason says what is wrong with it.
	Reason string
}

func (e *InvalidIDError) Error() string {
	return fmt.Sprintf("invalid session id %q: %s", e.ID, e.Reason)
}

// Unwrap returns ErrInvalidID and engine.ErrInvalidParam.
func (e *InvalidIDError) Unwrap() []error { return []error{ErrInvalidID, engine.ErrInvalidParam} }

// ValidateID checks a caller's session id: 1 to MaxIDLength bytes of
// UTF-8 without control characters.
func ValidateID(id string) error {
	bad := func(reason string) error {
		shown := id
		if len(shown) > MaxIDLength {
			shown = shown[:MaxIDLength]
		}
		return &InvalidIDError{ID: shown, Reason: reason}
	}
	switch {
	case id == "":
		return bad("empty")
	case len(id) > MaxIDLength:
		return bad(fmt.Sprintf("%d bytes; at most %d", len(id), MaxIDLength))
	case !utf8.ValidString(id):
		return bad("not valid UTF-8")
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return bad(fmt.Sprintf("control character %U", r))
		}
	}
	return nil
}
