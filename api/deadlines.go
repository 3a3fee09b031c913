package api

import (
	"fmt"
	"time"
)

// Deadlines bound one request. A zero field turns that deadline off; the
// zero value enforces none.
type Deadlines struct {
	// FirstToken bounds submission to first token.
	FirstToken time.Duration
	// Stall bounds the gap between consecutive tokens.
	Stall time.Duration
	// Total bounds submission to the end.
	Total time.Duration
}

// Validate refuses negative bounds.
func (d Deadlines) Validate() error {
	if d.FirstToken < 0 || d.Stall < 0 || d.Total < 0 {
		return fmt.Errorf("retry: deadlines must not be negative (first token %v, stall %v, total %v)", d.FirstToken, d.Stall, d.Total)
	}
	return nil
}

// Zero reports whether no deadline is set.
func (d Deadlines) Zero() bool { return d == Deadlines{} }

// Or returns d with its zero fields taken from def.
func (d Deadlines) Or(def Deadlines) Deadlines {
	if d.FirstToken == 0 {
		d.FirstToken = def.FirstToken
	}
	if d.Stall == 0 {
		d.Stall = def.Stall
	}
	if d.Total == 0 {
		d.Total = def.Total
	}
	return d
}
