package toolcall

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/grammar"
)

func TestParse(t *testing.T) {
	cases := []struct {
		f       Format
		text    string
		forced  bool
		content string
		calls   []Call
	}{
		{Hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", false,
			"Let me check.", []Call{{"get_weather", `{"city": "Paris"}`}}},
		{Hermes, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{\"x\":1}}</tool_call>", false,
			"", []Call{{"a", `{}`}, {"b", `{"x":1}`}}},
		{Hermes, "{\"name\":\"a\",\"arguments\":{\"k\":[1,2]}}", true, "", []Call{{"a", `{"k":[1,2]}`}}},
		{Hermes, "no call here", false, "no call here", nil},
		{Hermes, "<tool_call>{broken</tool_call>", false, "<tool_call>{broken</tool_call>", nil},
		{Llama3, `<|python_tag|>{"name": "f", "parameters": {"a": "b"}}; {"name": "g", "parameters": {}}`, false,
			"", []Call{{"f", `{"a": "b"}`}, {"g", `{}`}}},
		{Llama3, `{"name": "f", "parameters": {"a": 1}}`, true, "", []Call{{"f", `{"a": 1}`}}},
		{Llama3, `The answer is {not json}`, false, `The answer is {not json}`, nil},
		{Mistral, `[TOOL_CALLS] [{"name": "f", "arguments": {"q": "x"}}]`, false, "", []Call{{"f", `{"q": "x"}`}}},
		{Mistral, `[{"name": "f", "arguments": "{\"q\":1}"}]`, true, "", []Call{{"f", `{"q":1}`}}},
	}
	for _, c := range cases {
		content, calls := c.f.Parse(c.text, c.forced)
		if content != c.content || len(calls) != len(c.calls) {
			t.Errorf("%s Parse(%q) = %q, %v; want %q, %v", c.f, c.text, content, calls, c.content, c.calls)
			continue
		}
		for i := range calls {
			if calls[i] != c.calls[i] {
				t.Errorf("%s Parse(%q) call %d = %v, want %v", c.f, c.text, i, calls[i], c.calls[i])
			}
		}
	}
}

func TestParseToolsRefusesMalformed(t *testing.T) {
	for _, raw := range []string{
		`{}`, `[{"type":"retrieval"}]`, `[{"type":"function"}]`, `[{"type":"function","function":{"name":""}}]`,
		`[{"type":"function","function":{"name":"bad name"}}]`, `[{"type":"function","function":{"name":"f","parameters":[1]}}]`,
		`[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]`,
	} {
		if _, _, err := ParseTools(json.RawMessage(raw)); !errors.Is(err, ErrBadTool) {
			t.Errorf("ParseTools(%s) = %v, want ErrBadTool", raw, err)
		}
	}
	// Parameters the grammar refuses name the tool and the path inside.
	_, _, err := ParseTools(json.RawMessage(`[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g","parameters":{"type":"object","properties":{"x":{"type":"string","format":"color"}}}}}]`))
	var pe *ParamsError
	if !errors.As(err, &pe) || !errors.Is(err, ErrBadTool) || !errors.Is(err, grammar.ErrUnsupported) || pe.Param() != "tools[1].function.parameters" || pe.Name != "g" {
		t.Fatalf("ParseTools with an unsupported format: %v", err)
	}
	tools, plain, err := ParseTools(json.RawMessage(`[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}]`))
	if err != nil || len(tools) != 1 || tools[0].Name != "f" || len(plain) != 1 {
		t.Fatalf("ParseTools: %v %v %v", tools, plain, err)
	}
}

// TestForcedCallsParse: whatever a random model writes under the forced
// call's grammar parses back into a call of the right tool with arguments
// that are a JSON object.
func TestForcedCallsParse(t *testing.T) {
	tools := []Tool{
		{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}`)},
		{Name: "noop"},
	}
	pieces := make([][]byte, 300)
	for i := 0; i < 256; i++ {
		pieces[i] = []byte{byte(i)}
	}
	pieces[256] = []byte("</s>")
	v := grammar.NewVocab(pieces, []int32{256}, nil)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, f := range []Format{Hermes, Llama3, Mistral} {
		for _, name := range []string{"", "get_weather", "noop"} {
			schema, err := f.Schema(tools, name)
			if err != nil {
				t.Fatal(err)
			}
			g, err := v.Compile(schema, grammar.Limits{MaxStringLength: 12, MaxWhitespace: 2})
			if err != nil {
				t.Fatalf("%s: %v", schema, err)
			}
			for k := 0; k < 20; k++ {
				m := g.NewMatcher()
				var out []byte
				mask := make([]uint64, v.MaskWords())
				for !m.Done() && len(out) < 5000 {
					m.FillMask(mask)
					var ids []int32
					for id := int32(0); id < 300; id++ {
						if engine.MaskAllows(mask, id) {
							ids = append(ids, id)
						}
					}
					id := ids[rng.IntN(len(ids))]
					if err := m.Accept(id); err != nil {
						t.Fatal(err)
					}
					if id == 256 {
						break
					}
					out = append(out, pieces[id]...)
				}
				content, calls := f.Parse(string(out), true)
				if content != "" || len(calls) != 1 || (name != "" && calls[0].Name != name) || !json.Valid([]byte(calls[0].Arguments)) || calls[0].Arguments[0] != '{' {
					t.Fatalf("%s forced %q: %q parsed to %q, %v", f, name, out, content, calls)
				}
			}
		}
	}
	if _, err := Hermes.Schema(tools, "missing"); !errors.Is(err, ErrBadTool) {
		t.Errorf("unknown named tool: %v", err)
	}
}

func TestForcedHead(t *testing.T) {
	for text, want := range map[string]string{
		`{"name": "get_weather", "arguments": {"ci`: "get_weather",
		` [ {"name":"f\"x","parameters":`:           `f"x`,
	} {
		name, at, ok := ForcedHead(text)
		if !ok || name != want || at > len(text) {
			t.Errorf("ForcedHead(%q) = %q, %d, %v", text, name, at, ok)
		}
	}
	if _, _, ok := ForcedHead(`{"name": "get_wea`); ok {
		t.Error("ForcedHead matched an unfinished name")
	}
}
