package api

import (
	"errors"
	"fmt"
)

// ErrInvalidParam means a request parameter is out of range. Every
// *InvalidParamError wraps it.
var ErrInvalidParam = errors.New("invalid parameter")

// InvalidParamError names a request parameter and why it was refused.
type InvalidParamError struct {
	// Param is the parameter's name as an API user writes it ("top_p").
	Param string
	// Reason says what is wrong with it.
	Reason string
	// Err is the cause, when another package's error refused the value
	// (a tokenizer's *TemplateError or *UTF8Error); nil otherwise.
	Err error
}

func (e *InvalidParamError) Error() string {
	return fmt.Sprintf("invalid parameter %s: %s", e.Param, e.Reason)
}

// Unwrap returns ErrInvalidParam and the cause, so errors.Is/As find both.
func (e *InvalidParamError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalidParam}
	}
	return []error{ErrInvalidParam, e.Err}
}
