package openai

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/toolcall"
)

// pieces is an api.Source that yields text one piece per token.
type pieces struct {
	text []string
	next int
}

func (p *pieces) Recv(context.Context) (api.Chunk, error) {
	if p.next > len(p.text) {
		return api.Chunk{}, io.EOF
	}
	p.next++
	if p.next > len(p.text) {
		return api.Chunk{Finish: api.FinishStop, Usage: &api.Usage{CompletionTokens: len(p.text)}}, nil
	}
	return api.Chunk{Text: p.text[p.next-1], HasToken: true}, nil
}

func (p *pieces) Close(error) {}

// splitEvery cuts s into pieces of n bytes.
func splitEvery(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// TestReasoningWithTools: a Qwen3 reply that thinks, then calls a tool,
// streamed in pieces of every size and collected whole. The reasoning
// goes to reasoning_content, and the tool call is parsed from the content
// only (a <tool_call> inside the reasoning is not a call).
func TestReasoningWithTools(t *testing.T) {
	const reply = "<think>\nMaybe <tool_call>{\"name\": \"no\"}</tool_call>? No: look it up.\n</think>\n\nChecking.\n" +
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	const wantReasoning = "\nMaybe <tool_call>{\"name\": \"no\"}</tool_call>? No: look it up.\n"
	newF := func() *format {
		f := newFormat(true, "chatcmpl-x", 1, "m", false, false)
		f.tools = newToolStream(toolcall.Hermes, false)
		f.reasoning = toolcall.NewReasoningParser(false)
		return f
	}
	for n := 1; n <= len(reply); n++ {
		st := api.NewStream(t.Context(), &pieces{text: splitEvery(reply, n)}, api.Header{})
		w := httptest.NewRecorder()
		if err := (&Handler{}).streamSSE(w, st, newF()); err != nil {
			t.Fatal(err)
		}
		var reasoning, content, name, args strings.Builder
		finish := ""
		for _, line := range strings.Split(w.Body.String(), "\n\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var ev struct {
				Choices []struct {
					Delta struct {
						Content          string     `json:"content"`
						ReasoningContent string     `json:"reasoning_content"`
						ToolCalls        []toolCall `json:"tool_calls"`
					} `json:"delta"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("%q: %v", data, err)
			}
			d := ev.Choices[0].Delta
			reasoning.WriteString(d.ReasoningContent)
			content.WriteString(d.Content)
			for _, c := range d.ToolCalls {
				name.WriteString(c.Function.Name)
				args.WriteString(c.Function.Arguments)
			}
			finish += ev.Choices[0].FinishReason
		}
		if reasoning.String() != wantReasoning || content.String() != "\n\nChecking.\n" ||
			name.String() != "get_weather" || args.String() != `{"city": "Paris"}` || finish != "tool_calls" {
			t.Fatalf("pieces of %d: reasoning %q, content %q, call %s(%s), finish %q", n, reasoning.String(), content.String(), name.String(), args.String(), finish)
		}
	}
	st := api.NewStream(t.Context(), &pieces{text: splitEvery(reply, 3)}, api.Header{})
	body, _, err := newF().collect(st)
	if err != nil {
		t.Fatal(err)
	}
	msg := body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	calls, _ := msg["tool_calls"].([]toolCall)
	if msg["reasoning_content"] != wantReasoning || msg["content"] != "\n\nChecking.\n" || len(calls) != 1 || calls[0].Function.Name != "get_weather" {
		t.Fatalf("whole: %v", msg)
	}
}

func TestPyNumbers(t *testing.T) {
	kw, err := templateKwargs(json.RawMessage(`{"a": 3, "b": 1.5, "c": 2e3, "d": [1, {"e": -4}], "f": true}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"a": 3, "b": 1.5, "c": 2000.0, "d": []any{1, map[string]any{"e": -4}}, "f": true}
	if !reflect.DeepEqual(kw, want) {
		t.Errorf("got %#v, want %#v", kw, want)
	}
}
