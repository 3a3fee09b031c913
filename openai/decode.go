package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"
)

// readBody reads the request body within the size limit and checks that it
// is UTF-8.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &bodyTooLargeError{limit: limit}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &bodyTooLargeError{limit: tooBig.Limit}
		}
		return nil, badRequest("", "invalid_body", "cannot read request body: %v", err)
	}
	if !utf8.Valid(body) {
		return nil, badRequest("", "invalid_encoding", "request body is not valid UTF-8 (first bad byte at offset %d)", invalidUTF8At(body))
	}
	return body, nil
}

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// decodeStrict decodes a JSON object into v, refusing unknown fields and
// trailing data, with messages that name the field at fault.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return badRequest("", "invalid_json", "invalid JSON: unexpected data after the request object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("", "invalid_json", "invalid JSON: unexpected data after the request object")
	}
	return nil
}

// jsonError turns encoding/json's errors into 400s that name the field.
func jsonError(err error) error {
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
		ae     *apiError
	)
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &syntax):
		return badRequest("", "invalid_json", "invalid JSON at byte offset %d: %v", syntax.Offset, syntax)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "invalid_json", "invalid JSON: the body is empty or ends early")
	case errors.As(err, &typ):
		field := strings.ReplaceAll(typ.Field, "commonFields.", "")
		if field == "" {
			return badRequest("", "invalid_type", "the request body must be a JSON object, not %s", typ.Value)
		}
		return badRequest(field, "invalid_type", "field %q has the wrong type: got %s, want %s", field, typ.Value, jsonKind(typ.Type.String()))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return badRequest(strings.Trim(name, `"`), "unsupported_field", "unknown or unsupported field %s", name)
	default:
		return badRequest("", "invalid_json", "invalid JSON: %v", err)
	}
}

// jsonKind names a Go type the way a JSON user thinks of it.
func jsonKind(goType string) string {
	switch {
	case strings.Contains(goType, "int"):
		return "an integer"
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	case strings.HasPrefix(goType, "[]") || strings.HasPrefix(goType, "*[]"):
		return "an array"
	case strings.Contains(goType, "string"):
		return "a string"
	default:
		return "an object"
	}
}

// isNull reports whether a raw field was absent or JSON null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// parseStop reads "stop": a string or an array of strings.
func parseStop(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("stop", "invalid_type", "field \"stop\" must be a string or an array of strings")
	}
	if len(list) > maxStops {
		return nil, badRequest("stop", "invalid_value", "field \"stop\" has %d entries; at most %d are allowed", len(list), maxStops)
	}
	return list, nil
}

const maxStops = 16

// parseContent reads a message's content: a string, null, or an array of
// text parts (joined with newlines, as vLLM does).
func parseContent(raw json.RawMessage, param string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param, "invalid_type", "field %q must be a string or an array of content parts", param)
	}
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		var typ, text string
		if err := json.Unmarshal(p["type"], &typ); err != nil {
			return "", badRequest(fmt.Sprintf("%s.%d.type", param, i), "invalid_type", "content part %d of %q needs a string \"type\"", i, param)
		}
		if typ != "text" {
			return "", badRequest(fmt.Sprintf("%s.%d.type", param, i), "unsupported_content",
				"content part type %q is not supported: this server takes text parts only", typ)
		}
		if err := json.Unmarshal(p["text"], &text); err != nil || p["text"] == nil {
			return "", badRequest(fmt.Sprintf("%s.%d.text", param, i), "invalid_type", "text part %d of %q needs a string \"text\"", i, param)
		}
		for k := range p {
			if k != "type" && k != "text" {
				return "", badRequest(fmt.Sprintf("%s.%d.%s", param, i, k), "unsupported_field", "unknown or unsupported field %q in a text part", k)
			}
		}
		texts = append(texts, text)
	}
	return strings.Join(texts, "\n"), nil
}
