// Package toolcall knows how model families write tool calls: it detects
// a tokenizer's family, parses generated text into calls, and builds the
// JSON schema and prompt prefix that force a valid call when a request
// requires one (with engine/grammar).
//
// Families: Hermes-style <tool_call>{...}</tool_call> blocks (Qwen2.5,
// Qwen3, Hermes), Llama 3.1+ JSON objects {"name", "parameters"} (after an
// optional <|python_tag|>, several separated by ";"), and Mistral's
// [TOOL_CALLS] [{"name", "arguments"}, ...].
package toolcall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/mlxserving/mlxserving/engine/grammar"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

// Format is a family's way of writing tool calls.
type Format string

const (
	Hermes  Format = "hermes"
	Llama3  Format = "llama3"
	Mistral Format = "mistral"
)

// Detect picks the format from the tokenizer's added tokens; Hermes when
// nothing tells.
func Detect(tok *tokenizer.Tokenizer) Format {
	has := func(s string) bool { _, ok := tok.TokenID(s); return ok }
	switch {
	case has("<tool_call>"):
		return Hermes
	case has("[TOOL_CALLS]"):
		return Mistral
	case has("<|python_tag|>"), has("<|start_header_id|>"):
		return Llama3
	}
	return Hermes
}

// Tool is a function the model may call.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON schema of the arguments; nil takes any object.
	Parameters json.RawMessage
}

// Call is one parsed tool call.
type Call struct {
	Name string
	// Arguments is the arguments object as JSON text.
	Arguments string
}

// ErrBadTool means a tool definition is malformed.
var ErrBadTool = errors.New("invalid tool definition")

// ParamsError is a tool whose parameters are not a schema that
// constrained decoding can enforce: Err is the engine/grammar error
// (*grammar.SchemaError or *grammar.UnsupportedError), whose path is
// inside the parameters.
type ParamsError struct {
	Index int    // the tool's index in the tools array
	Name  string // the function's name
	Err   error
}

func (e *ParamsError) Error() string {
	return fmt.Sprintf("%v: %s: invalid schema for function %q: %v", ErrBadTool, e.Param(), e.Name, e.Err)
}

// Param is the request field at fault, as OpenAI names it:
// tools[i].function.parameters.
func (e *ParamsError) Param() string { return fmt.Sprintf("tools[%d].function.parameters", e.Index) }

// Unwrap returns ErrBadTool and the grammar's error.
func (e *ParamsError) Unwrap() []error { return []error{ErrBadTool, e.Err} }

var namePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// ParseTools reads OpenAI's tools array: [{"type":"function","function":
// {"name","description","parameters","strict"}}]. Errors wrap ErrBadTool;
// parameters that engine/grammar refuses are a *ParamsError, whether or
// not a call is forced.
func ParseTools(raw json.RawMessage) ([]Tool, []map[string]any, error) {
	var defs []struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &defs); err != nil {
		return nil, nil, fmt.Errorf("%w: tools must be an array of function tools: %v", ErrBadTool, err)
	}
	var plain []map[string]any
	if err := json.Unmarshal(raw, &plain); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBadTool, err)
	}
	tools := make([]Tool, 0, len(defs))
	seen := map[string]bool{}
	for i, d := range defs {
		switch {
		case d.Type != "function":
			return nil, nil, fmt.Errorf("%w: tools[%d].type is %q: only \"function\" is supported", ErrBadTool, i, d.Type)
		case d.Function == nil:
			return nil, nil, fmt.Errorf("%w: tools[%d].function is missing", ErrBadTool, i)
		case !namePattern.MatchString(d.Function.Name):
			return nil, nil, fmt.Errorf("%w: tools[%d].function.name %q must be 1 to 64 letters, digits, _ or -", ErrBadTool, i, d.Function.Name)
		case seen[d.Function.Name]:
			return nil, nil, fmt.Errorf("%w: tools[%d]: function %q is defined twice", ErrBadTool, i, d.Function.Name)
		}
		p := bytes.TrimSpace(d.Function.Parameters)
		if len(p) > 0 && !bytes.Equal(p, []byte("null")) && p[0] != '{' {
			return nil, nil, fmt.Errorf("%w: tools[%d].function.parameters must be a JSON schema object", ErrBadTool, i)
		}
		if bytes.Equal(p, []byte("null")) {
			p = nil
		}
		if p != nil {
			if err := grammar.Check(p); err != nil {
				return nil, nil, &ParamsError{Index: i, Name: d.Function.Name, Err: err}
			}
		}
		seen[d.Function.Name] = true
		tools = append(tools, Tool{Name: d.Function.Name, Description: d.Function.Description, Parameters: p})
	}
	return tools, plain, nil
}

// argsKey is the key holding the arguments in a call object.
func (f Format) argsKey() string {
	if f == Llama3 {
		return "parameters"
	}
	return "arguments"
}

// Prefix is the text that opens a call; a forced call gets it appended to
// the prompt, so the model writes only the call's JSON.
func (f Format) Prefix() string {
	switch f {
	case Hermes:
		return "<tool_call>\n"
	case Mistral:
		return "[TOOL_CALLS]"
	}
	return ""
}

// Schema is the JSON schema of what follows Prefix in a forced call: one
// call of the named tool, or of any of tools when name is "".
func (f Format) Schema(tools []Tool, name string) ([]byte, error) {
	var alts []any
	for _, t := range tools {
		if name != "" && t.Name != name {
			continue
		}
		var params any = map[string]any{"type": "object"}
		if len(t.Parameters) > 0 {
			params = json.RawMessage(t.Parameters)
		}
		alts = append(alts, map[string]any{
			"type": "object",
			"properties": orderedProps{
				{"name", map[string]any{"const": t.Name}},
				{f.argsKey(), params},
			},
			"required":             []string{"name", f.argsKey()},
			"additionalProperties": false,
		})
	}
	if len(alts) == 0 {
		return nil, fmt.Errorf("%w: tool_choice names function %q, which is not among the tools", ErrBadTool, name)
	}
	var call any = map[string]any{"anyOf": alts}
	if len(alts) == 1 {
		call = alts[0]
	}
	if f == Mistral {
		call = map[string]any{"type": "array", "items": call, "minItems": 1, "maxItems": 1}
	}
	return json.Marshal(call)
}

// orderedProps marshals as an object keeping its order, so "name" is
// generated before the arguments.
type orderedProps []struct {
	k string
	v any
}

func (o orderedProps) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, kv := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(kv.k)
		v, err := json.Marshal(kv.v)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Parse splits generated text into content and tool calls. forced means
// the prompt ended with Prefix, so the text is the call's JSON. Text that
// only looks like a call but does not parse stays content.
func (f Format) Parse(text string, forced bool) (content string, calls []Call) {
	if forced {
		text = f.Prefix() + text
	}
	switch f {
	case Hermes:
		return parseHermes(text)
	case Mistral:
		t := strings.TrimSpace(text)
		t = strings.TrimSpace(strings.TrimPrefix(t, "[TOOL_CALLS]"))
		if calls, ok := parseArray(t, "arguments"); ok {
			return "", calls
		}
	case Llama3:
		t := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "<|python_tag|>"))
		if calls, ok := parseObjects(t); ok {
			return "", calls
		}
	}
	return text, nil
}

func parseHermes(text string) (string, []Call) {
	var calls []Call
	var content strings.Builder
	rest := text
	for {
		i := strings.Index(rest, "<tool_call>")
		if i < 0 {
			content.WriteString(rest)
			break
		}
		content.WriteString(rest[:i])
		body := rest[i+len("<tool_call>"):]
		end := strings.Index(body, "</tool_call>")
		next := ""
		if end >= 0 {
			body, next = body[:end], body[end+len("</tool_call>"):]
		}
		c, ok := callOf([]byte(strings.TrimSpace(body)), "arguments")
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
		if end < 0 {
			break
		}
		rest = next
	}
	return strings.TrimSpace(content.String()), calls
}

func parseArray(t string, key string) ([]Call, bool) {
	var list []json.RawMessage
	if json.Unmarshal([]byte(t), &list) != nil || len(list) == 0 {
		return nil, false
	}
	calls := make([]Call, 0, len(list))
	for _, raw := range list {
		c, ok := callOf(raw, key)
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
	}
	return calls, true
}

// parseObjects reads one or more call objects separated by ";" or
// whitespace.
func parseObjects(t string) ([]Call, bool) {
	var calls []Call
	for {
		if !strings.HasPrefix(t, "{") {
			return nil, false
		}
		dec := json.NewDecoder(strings.NewReader(t))
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return nil, false
		}
		c, ok := callOf(raw, "parameters")
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
		t = strings.TrimSpace(t[dec.InputOffset():])
		t = strings.TrimSpace(strings.TrimPrefix(t, ";"))
		if t == "" {
			return calls, true
		}
	}
}

// callOf reads {"name": ..., key: {...}} (also accepting the other of
// "arguments"/"parameters"; arguments given as a JSON string are kept).
func callOf(raw []byte, key string) (Call, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return Call{}, false
	}
	var name string
	if json.Unmarshal(obj["name"], &name) != nil || name == "" {
		return Call{}, false
	}
	args, ok := obj[key]
	if !ok {
		args, ok = obj["arguments"]
	}
	if !ok {
		args, ok = obj["parameters"]
	}
	if !ok {
		args = json.RawMessage("{}")
	}
	var s string
	if json.Unmarshal(args, &s) == nil {
		return Call{Name: name, Arguments: s}, true
	}
	if !json.Valid(args) {
		return Call{}, false
	}
	return Call{Name: name, Arguments: string(bytes.TrimSpace(args))}, true
}

// callHead matches the start of a forced call up to its arguments:
// `{"name": "f", "arguments": ` (or "parameters"; Mistral's in a list).
var callHead = regexp.MustCompile(`^\s*\[?\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*`)

// ForcedHead reads the start of a forced call's text: once the name and
// the arguments key are complete it returns the name and the offset where
// the arguments begin.
func ForcedHead(text string) (name string, argsAt int, ok bool) {
	m := callHead.FindStringSubmatchIndex(text)
	if m == nil {
		return "", 0, false
	}
	if json.Unmarshal([]byte(text[m[2]:m[3]]), &name) != nil {
		return "", 0, false
	}
	return name, m[1], true
}

// MayStart reports whether text (the output so far) may be the start of
// a tool call in this format, so a streaming server should hold it back.
func (f Format) MayStart(text string) bool {
	t := strings.TrimLeft(text, " \t\r\n")
	var open string
	switch f {
	case Hermes:
		open = "<tool_call>"
	case Mistral:
		if strings.HasPrefix(t, "[") || strings.HasPrefix("[TOOL_CALLS]", t) {
			return true
		}
		open = "["
	case Llama3:
		open = "{"
		if strings.HasPrefix("<|python_tag|>", t) || strings.HasPrefix(t, "<|python_tag|>") {
			return true
		}
	}
	return strings.HasPrefix(t, open) || strings.HasPrefix(open, t)
}

// ParseCall reads one call object {"name": ..., "arguments"|"parameters":
// {...}}.
func ParseCall(raw string) (Call, bool) { return callOf([]byte(raw), "arguments") }
