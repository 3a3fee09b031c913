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
			param := "tools"
			if pe, ok := errors.AsType[*toolcall.ParamsError](err); ok {
				param = pe.Param()
			}
			return false, badRequest(param, "invalid_value", "%s", err.Error())
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

// callDeltas turns whole calls into stream deltas: one opening each call
// (index, id, type, name), one with its arguments.
func callDeltas(calls []toolcall.Call) []toolDelta {
	var out []toolDelta
	for i, c := range calls {
		out = append(out, toolDelta{index: i, id: callID(), name: c.Name}, toolDelta{index: i, args: c.Arguments})
	}
	return out
}
