package openai

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/toolcall"
)

// toolRequest reads tools and tool_choice into req: the definitions go
// to the chat template (unless tool_choice is "none"); "required" or a
// named function forces a call. It reports whether replies are parsed for
// tool calls.
func (c *chatRequest) toolRequest(req *api.ChatRequest) (bool, error) {
	var tools []toolcall.Tool
	var plain []map[string]any
	if !isNull(c.Tools) && string(c.Tools) != "[]" {
		var err error
		if tools, plain, err = toolcall.ParseTools(c.Tools); err != nil {
			return false, badRequest("tools", "invalid_value", "%s", err.Error())
		}
	}
	choice, name := "auto", ""
	if len(tools) == 0 {
		choice = "none"
	}
	if !isNull(c.ToolChoice) {
		var s string
		var obj struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		switch {
		case json.Unmarshal(c.ToolChoice, &s) == nil:
			if s != "none" && s != "auto" && s != "required" {
				return false, badRequest("tool_choice", "invalid_value", "tool_choice %q: want none, auto, required or a function", s)
			}
			choice = s
		case json.Unmarshal(c.ToolChoice, &obj) == nil && obj.Type == "function" && obj.Function.Name != "":
			choice, name = "named", obj.Function.Name
		default:
			return false, badRequest("tool_choice", "invalid_value", `tool_choice must be "none", "auto", "required" or {"type":"function","function":{"name":...}}`)
		}
	}
	if len(tools) == 0 && (choice == "required" || choice == "named") {
		return false, badRequest("tool_choice", "invalid_value", "tool_choice %s needs tools", choice)
	}
	if choice == "none" {
		return false, nil
	}
	req.Tools = plain
	if choice == "auto" {
		return true, nil
	}
	if len(req.JSONSchema) > 0 {
		return false, badRequest("response_format", "invalid_value", "response_format cannot be combined with a required tool call")
	}
	req.ForceTool = "*"
	if choice == "named" {
		req.ForceTool = name
		found := false
		for _, t := range tools {
			found = found || t.Name == name
		}
		if !found {
			return false, badRequest("tool_choice", "invalid_value", "tool_choice names function %q, which is not among the tools", name)
		}
	}
	for _, t := range tools {
		req.ForceTools = append(req.ForceTools, api.ToolSpec{Name: t.Name, Parameters: t.Parameters})
	}
	return true, nil
}

// templateToolCalls turns OpenAI's assistant tool_calls (arguments as a
// JSON string) into what chat templates expect (arguments as an object).
func templateToolCalls(calls []map[string]any) []map[string]any {
	out := make([]map[string]any, len(calls))
	for i, call := range calls {
		c := make(map[string]any, len(call))
		for k, v := range call {
			c[k] = v
		}
		if fn, ok := call["function"].(map[string]any); ok {
			f := make(map[string]any, len(fn))
			for k, v := range fn {
				f[k] = v
			}
			if s, ok := fn["arguments"].(string); ok {
				var obj any
				if json.Unmarshal([]byte(s), &obj) == nil {
					f["arguments"] = obj
				}
			}
			c["function"] = f
		}
		out[i] = c
	}
	return out
}

// toolCall is a call in OpenAI's response shape.
type toolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func callID() string { return "call_" + strings.ToLower(rand.Text()[:24]) }

func toolCalls(calls []toolcall.Call) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		out[i].ID, out[i].Type = callID(), "function"
		out[i].Function.Name, out[i].Function.Arguments = c.Name, c.Arguments
	}
	return out
}

// toolStream holds back streamed text that may be a tool call, releasing
// the rest as content. A forced call streams: its opening delta (id,
// name) once the name is complete, then its arguments as they come; other
// held text is parsed when the stream ends.
type toolStream struct {
	f      toolcall.Format
	forced bool
	held   strings.Builder
	locked bool // everything from here on is held
	text   strings.Builder

	opened bool   // a forced call's opening delta went out
	argsAt int    // where its arguments start in held
	sent   int    // bytes of arguments sent
	id     string // its id
}

// toolDelta is one streamed piece of a call: its opening (id and name)
// or more of its arguments.
type toolDelta struct {
	id, name, args string
}

const hermesOpen = "<tool_call>"

// feed takes a text delta and returns the text safe to send as content
// and the call deltas ready to send.
func (t *toolStream) feed(delta string) (string, []toolDelta) {
	if t.forced {
		t.held.WriteString(delta)
		return "", t.forcedDeltas()
	}
	if t.locked {
		t.held.WriteString(delta)
		return "", nil
	}
	all := t.held.String() + delta
	t.held.Reset()
	if t.f == toolcall.Hermes {
		if i := strings.Index(all, hermesOpen); i >= 0 {
			t.held.WriteString(all[i:])
			t.locked = true
			return t.emit(all[:i]), nil
		}
		// Hold the longest suffix that may begin the opener.
		for j := max(0, len(all)-len(hermesOpen)); j < len(all); j++ {
			if strings.HasPrefix(hermesOpen, all[j:]) {
				t.held.WriteString(all[j:])
				return t.emit(all[:j]), nil
			}
		}
		return t.emit(all), nil
	}
	if t.text.Len() == 0 && t.f.MayStart(all) {
		t.held.WriteString(all)
		if strings.TrimSpace(all) != "" && !strings.HasPrefix(strings.TrimSpace(all), "<") {
			t.locked = true
		}
		return "", nil
	}
	return t.emit(all), nil
}

// forcedDeltas streams a forced call: everything before the last "}" of
// its arguments so far is arguments (the call's own closing brackets
// and the whitespace before them come only after).
func (t *toolStream) forcedDeltas() []toolDelta {
	all := t.held.String()
	var out []toolDelta
	if !t.opened {
		name, at, ok := toolcall.ForcedHead(all)
		if !ok {
			return nil
		}
		t.opened, t.argsAt, t.id = true, at, callID()
		out = append(out, toolDelta{id: t.id, name: name})
	}
	args := all[t.argsAt:]
	if t.sent == 0 { // whitespace before the arguments is not theirs
		trimmed := strings.TrimLeft(args, " \t\r\n")
		t.argsAt += len(args) - len(trimmed)
		args = trimmed
	}
	safe := strings.LastIndexByte(args, '}')
	if safe < 0 {
		safe = len(args)
	}
	safe = len(strings.TrimRight(args[:safe], " \t\r\n"))
	if safe > t.sent {
		out = append(out, toolDelta{args: args[t.sent:safe]})
		t.sent = safe
	}
	return out
}

func (t *toolStream) emit(s string) string {
	t.text.WriteString(s)
	return s
}

// finish parses what was held: held text that turned out to be content,
// the calls found, and for a streamed forced call the rest of its
// arguments (its calls were already announced).
func (t *toolStream) finish() (string, []toolcall.Call, []toolDelta) {
	held := t.held.String()
	t.held.Reset()
	if held == "" {
		return "", nil, nil
	}
	content, calls := t.f.Parse(held, t.forced)
	if t.forced {
		if len(calls) != 1 || !t.opened {
			return "", nil, nil // a forced call cut short by max_tokens
		}
		var tail []toolDelta
		if a := calls[0].Arguments; len(a) > t.sent {
			tail = append(tail, toolDelta{args: a[t.sent:]})
		}
		return "", calls, tail
	}
	if len(calls) == 0 {
		return held, nil, nil
	}
	return content, calls, nil
}

// deltaChunk sends one toolDelta of call 0.
func (f *format) deltaChunk(d toolDelta) ([]byte, error) {
	idx := 0
	tc := toolCall{Index: &idx, ID: d.id}
	if d.id != "" {
		tc.Type = "function"
	}
	tc.Function.Name, tc.Function.Arguments = d.name, d.args
	delta, err := json.Marshal(map[string]any{"tool_calls": []toolCall{tc}})
	if err != nil {
		return nil, err
	}
	c := append(f.openChoice(append([]byte(nil), f.prefix...)), `,"delta":`...)
	c = append(c, delta...)
	c = append(c, `,"logprobs":null,"finish_reason":null}]`...)
	return f.end(c), nil
}

// toolCallChunks sends the calls as chat.completion.chunk deltas: one
// opening each call (id, type, name), one with its arguments.
func (f *format) toolCallChunks(b []byte, calls []toolcall.Call) ([][]byte, error) {
	var out [][]byte
	for i, tc := range toolCalls(calls) {
		idx := i
		open := tc
		open.Index = &idx
		args := open.Function.Arguments
		open.Function.Arguments = ""
		for _, d := range []toolCall{open, {Index: &idx}} {
			if d.ID == "" {
				d.Function.Arguments = args
			}
			delta, err := json.Marshal(map[string]any{"tool_calls": []toolCall{d}})
			if err != nil {
				return nil, err
			}
			c := append(f.openChoice(append([]byte(nil), f.prefix...)), `,"delta":`...)
			c = append(c, delta...)
			c = append(c, `,"logprobs":null,"finish_reason":null}]`...)
			out = append(out, f.end(c))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no calls")
	}
	return out, nil
}
