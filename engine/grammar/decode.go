package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
)

func decodeSchema(schema []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(schema))
	dec.UseNumber()
	v, err := decodeOrdered(dec, 0)
	if err != nil {
		return nil, &SchemaError{Reason: "not JSON: " + err.Error()}
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &SchemaError{Reason: "trailing data after the schema"}
	}
	switch s := v.(type) {
	case map[string]any:
		return s, nil
	case bool:
		if s {
			return map[string]any{}, nil
		}
	}
	return nil, &SchemaError{Reason: "a schema must be a JSON object or true"}
}

func canonical(v any) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(stripOrder(v)); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// orderKey holds, in every decoded object, its keys in document order:
// properties are generated in the order the schema lists them.
const orderKey = "\x00order"

func decodeOrdered(dec *json.Decoder, depth int) (any, error) {
	if depth > 128 {
		return nil, errors.New("nested deeper than 128 levels")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch d := tok.(type) {
	case json.Delim:
		switch d {
		case '{':
			m := map[string]any{}
			var order []string
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeOrdered(dec, depth+1)
				if err != nil {
					return nil, err
				}
				if _, dup := m[k]; !dup {
					order = append(order, k)
				}
				m[k] = v
			}
			m[orderKey] = order
			_, err := dec.Token()
			return m, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeOrdered(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
	}
	return tok, nil
}

// stripOrder removes orderKey entries, for re-encoding values.
func stripOrder(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			if k != orderKey {
				out[k] = stripOrder(e)
			}
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = stripOrder(e)
		}
		return out
	}
	return v
}
