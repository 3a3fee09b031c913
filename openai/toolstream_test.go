package openai

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/toolcall"
)

// TestToolStream feeds model outputs in random small pieces and checks
// what streams: content as content, every call opened once with its index
// and name, its arguments assembled from the deltas equal to the parsed
// call's, and nothing of the call syntax leaking into content.
func TestToolStream(t *testing.T) {
	cases := []struct {
		f       toolcall.Format
		forced  bool
		text    string
		content string
		calls   []toolcall.Call
	}{
		{toolcall.Hermes, false, "Checking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": {\"a\": [1, \"}\"]}}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>",
			"Checking both.\n", []toolcall.Call{{Name: "get_weather", Arguments: `{"city": "Paris", "n": {"a": [1, "}"]}}`}, {Name: "noop", Arguments: `{}`}}},
		{toolcall.Hermes, false, "No tools needed: 2 < 3.", "No tools needed: 2 < 3.", nil},
		{toolcall.Llama3, false, `{"name": "f", "parameters": {"q": "a\"}b"}}; {"name": "g", "parameters": {"x": 1}}`,
			"", []toolcall.Call{{Name: "f", Arguments: `{"q": "a\"}b"}`}, {Name: "g", Arguments: `{"x": 1}`}}},
		{toolcall.Llama3, false, `{"answer": 42}`, `{"answer": 42}`, nil},
		{toolcall.Mistral, false, `[{"name": "f", "arguments": {"k": [1, 2]}}, {"name": "g", "arguments": {}}]`,
			"", []toolcall.Call{{Name: "f", Arguments: `{"k": [1, 2]}`}, {Name: "g", Arguments: `{}`}}},
		{toolcall.Hermes, true, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}", "",
			[]toolcall.Call{{Name: "get_weather", Arguments: `{"city": "Oslo"}`}}},
		{toolcall.Mistral, true, "[{\"name\": \"f\", \"arguments\": {\"city\": \"Oslo\"}} ]", "",
			[]toolcall.Call{{Name: "f", Arguments: `{"city": "Oslo"}`}}},
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for _, c := range cases {
		for trial := 0; trial < 20; trial++ {
			ts := newToolStream(c.f, c.forced)
			var content strings.Builder
			var deltas []toolDelta
			for rest := c.text; rest != ""; {
				n := min(len(rest), 1+rng.IntN(5))
				text, ds := ts.feed(rest[:n])
				content.WriteString(text)
				deltas = append(deltas, ds...)
				rest = rest[n:]
			}
			text, calls, tail := ts.finish()
			content.WriteString(text)
			deltas = append(deltas, tail...)
			if len(calls) > 0 && !ts.streamed {
				for i, call := range calls {
					deltas = append(deltas, toolDelta{index: i, id: "x", name: call.Name}, toolDelta{index: i, args: call.Arguments})
				}
			}
			if content.String() != c.content {
				t.Fatalf("%s %q: content %q, want %q", c.f, c.text, content.String(), c.content)
			}
			got := make([]toolcall.Call, 0)
			for _, d := range deltas {
				if d.id != "" {
					if d.index != len(got) {
						t.Fatalf("%s %q: call opened with index %d, want %d", c.f, c.text, d.index, len(got))
					}
					got = append(got, toolcall.Call{Name: d.name})
					continue
				}
				if d.index != len(got)-1 {
					t.Fatalf("%s %q: arguments for call %d while call %d is open", c.f, c.text, d.index, len(got)-1)
				}
				got[d.index].Arguments += d.args
			}
			if len(got) != len(c.calls) {
				t.Fatalf("%s %q: calls %v, want %v", c.f, c.text, got, c.calls)
			}
			for i := range got {
				if got[i] != c.calls[i] {
					t.Fatalf("%s %q: call %d %v, want %v", c.f, c.text, i, got[i], c.calls[i])
				}
			}
		}
	}
}
