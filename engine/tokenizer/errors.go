package tokenizer

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with errors.Is.
var (
	// ErrMalformed means tokenizer.json or tokenizer_config.json is not
	// valid JSON or lacks a required field.
	ErrMalformed = errors.New("malformed tokenizer file")
	// ErrUnsupported means the file is valid but asks for a model,
	// normalizer, pre-tokenizer, decoder or post-processor this package
	// does not implement.
	ErrUnsupported = errors.New("unsupported tokenizer feature")
	// ErrInvalidUTF8 means text passed to Encode is not valid UTF-8.
	ErrInvalidUTF8 = errors.New("text is not valid UTF-8")
	// ErrInvalidToken means a token id passed to Decode is outside the
	// vocabulary.
	ErrInvalidToken = errors.New("token id out of range")
	// ErrNoChatTemplate means the tokenizer has no chat template (or no
	// template of the requested name).
	ErrNoChatTemplate = errors.New("no chat template")
	// ErrTooShort means a token limit given to EncodeTruncated leaves no
	// room for any text beside the special tokens.
	ErrTooShort = errors.New("token limit too small")
	// ErrTemplate means a chat template failed to parse or render: a
	// syntax error, raise_exception, or an undefined value used in a way
	// that needs a value.
	ErrTemplate = errors.New("chat template error")
)

// FileError names the file a load failed on and what is wrong with it.
// Unwrap yields ErrMalformed or ErrUnsupported (or an *os.PathError's
// cause when the file could not be read).
type FileError struct {
	// File is the file's path (or "tokenizer.json"/"tokenizer_config.json"
	// for FromJSON).
	File string
	// Field is the JSON path of the offending field, if any
	// ("model.type", "pre_tokenizer.pretokenizers[0]").
	Field string
	// Reason says what is wrong.
	Reason string
	// Err is the sentinel (ErrMalformed, ErrUnsupported) or underlying
	// error.
	Err error
}

func (e *FileError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("tokenizer: %s: %s: %s", e.File, e.Field, e.Reason)
	}
	return fmt.Sprintf("tokenizer: %s: %s", e.File, e.Reason)
}

// Unwrap returns the sentinel or underlying error.
func (e *FileError) Unwrap() error { return e.Err }

// TemplateError says why a chat template could not be parsed or rendered.
// Unwrap yields ErrTemplate.
type TemplateError struct {
	// File is the tokenizer_config.json the template came from.
	File string
	// Name is the template's name ("default" or the named template).
	Name string
	// Reason is the message, e.g. what raise_exception was given.
	Reason string
}

func (e *TemplateError) Error() string {
	return fmt.Sprintf("%s: chat template %q: %s", e.File, e.Name, e.Reason)
}

// Unwrap returns ErrTemplate.
func (e *TemplateError) Unwrap() error { return ErrTemplate }

// ErrorCode returns "template_error", the code the HTTP API answers a bad
// request with (see retry.Classify).
func (e *TemplateError) ErrorCode() string { return "template_error" }

// UTF8Error reports invalid UTF-8 in text passed to Encode. Unwrap yields
// ErrInvalidUTF8.
type UTF8Error struct {
	// Offset is the byte offset of the first invalid byte.
	Offset int
}

func (e *UTF8Error) Error() string {
	return fmt.Sprintf("tokenizer: text is not valid UTF-8 at byte %d", e.Offset)
}

// Unwrap returns ErrInvalidUTF8.
func (e *UTF8Error) Unwrap() error { return ErrInvalidUTF8 }

// InvalidTokenError reports a token id outside the vocabulary. Unwrap
// yields ErrInvalidToken.
type InvalidTokenError struct {
	// ID is the refused token id.
	ID int32
	// VocabSize is the tokenizer's VocabSize.
	VocabSize int
}

func (e *InvalidTokenError) Error() string {
	return fmt.Sprintf("tokenizer: token id %d is outside the vocabulary [0, %d)", e.ID, e.VocabSize)
}

// Unwrap returns ErrInvalidToken.
func (e *InvalidTokenError) Unwrap() error { return ErrInvalidToken }
