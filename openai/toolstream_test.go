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

// TestToolReplyCutShort: a reply cut anywhere (max_tokens) reads the same
// whole (non-streamed) as streamed: the same content and the same calls,
// so a call cut short comes back as far as it got in both, and complete
// calls before the cut are never lost.
func TestToolReplyCutShort(t *testing.T) {
	cases := []struct {
		f      toolcall.Format
		forced bool
		text   string
	}{
		{toolcall.Hermes, false, "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", \"fmt\": {\"h\": 24}}}\n</tool_call>"},
		{toolcall.Llama3, false, `{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"tz": "CET"}}`},
		{toolcall.Mistral, false, `[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz": "CET"}}]`},
		{toolcall.Hermes, true, `{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}`},
		{toolcall.Mistral, true, `[{"name": "get_weather", "arguments": {"city": "Paris"}}]`},
	}
	rng := rand.New(rand.NewPCG(2, 2))
	for _, c := range cases {
		headAt := strings.Index(c.text, `"city"`) // the first call's name is complete before it
		for cut := 1; cut <= len(c.text); cut++ {
			text := c.text[:cut]
			content, calls, complete := newToolStream(c.f, c.forced).whole(text)
			// The same text streamed in random pieces.
			ts := newToolStream(c.f, c.forced)
			var streamed strings.Builder
			var deltas []toolDelta
			for rest := text; rest != ""; {
				n := min(len(rest), 1+rng.IntN(6))
				s, ds := ts.feed(rest[:n])
				streamed.WriteString(s)
				deltas = append(deltas, ds...)
				rest = rest[n:]
			}
			s, parsed, tail := ts.finish()
			streamed.WriteString(s)
			deltas = append(deltas, tail...)
			var sc []toolcall.Call
			if len(parsed) > 0 {
				sc = parsed
			} else {
				for _, d := range deltas {
					if d.id != "" {
						sc = append(sc, toolcall.Call{Name: d.name})
					} else {
						sc[d.index].Arguments += d.args
					}
				}
			}
			if content != streamed.String() || len(calls) != len(sc) {
				t.Fatalf("%s cut at %d %q: whole %q %v, streamed %q %v", c.f, cut, text, content, calls, streamed.String(), sc)
			}
			for i := range calls {
				if calls[i].Function.Name != sc[i].Name || calls[i].Function.Arguments != sc[i].Arguments || calls[i].ID == "" {
					t.Fatalf("%s cut at %d %q: call %d whole %+v, streamed %+v", c.f, cut, text, i, calls[i], sc[i])
				}
			}
			if cut >= headAt && len(calls) == 0 {
				t.Fatalf("%s cut at %d %q: the call vanished (content %q)", c.f, cut, text, content)
			}
			if cut == len(c.text) && (!complete || len(calls) != 2-btoi(c.forced)) {
				t.Errorf("%s %q: complete %v, calls %v", c.f, text, complete, calls)
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
