package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type chatCases struct {
	Conversations map[string][]map[string]any `json:"conversations"`
	Tools         []map[string]any            `json:"tools"`
	Now           time.Time                   `json:"now"`
}

type chatGolden struct {
	Template     string         `json:"template"`
	Conversation string         `json:"conversation"`
	Generation   bool           `json:"generation"`
	Tools        bool           `json:"tools"`
	Extra        map[string]any `json:"extra"`
	Output       *string        `json:"output"`
	Error        *string        `json:"error"`
}

// toMessages converts a JSON conversation into Messages.
func toMessages(t *testing.T, conv []map[string]any) []Message {
	t.Helper()
	var out []Message
	for _, m := range conv {
		msg := Message{Role: m["role"].(string), Content: m["content"].(string)}
		if v, ok := m["name"].(string); ok {
			msg.Name = v
		}
		if v, ok := m["tool_call_id"].(string); ok {
			msg.ToolCallID = v
		}
		if calls, ok := m["tool_calls"].([]any); ok {
			for _, c := range calls {
				msg.ToolCalls = append(msg.ToolCalls, c.(map[string]any))
			}
		}
		out = append(out, msg)
	}
	return out
}

// templateTokenizer serves the testdata templates as a named template
// list on top of the llama2 tokenizer (bos "<s>", eos "</s>").
func templateTokenizer(t *testing.T) *Tokenizer {
	t.Helper()
	dir := tokenizerDir(t, "llama2")
	tokJSON, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "templates", "*.jinja"))
	var list []map[string]string
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, map[string]string{"name": filepath.Base(f), "template": string(src)})
	}
	cfg, _ := json.Marshal(map[string]any{"bos_token": "<s>", "eos_token": "</s>", "chat_template": list})
	tok, err := FromJSON(tokJSON, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestChatTemplateGolden renders every case of testdata/chat_cases.json and
// compares with Python Jinja2's rendering (testdata/golden/chat.json, made
// by testdata/gen/chat.py).
func TestChatTemplateGolden(t *testing.T) {
	var cases chatCases
	readJSON(t, filepath.Join("testdata", "chat_cases.json"), &cases)
	var golden []chatGolden
	readJSON(t, filepath.Join("testdata", "golden", "chat.json"), &golden)
	local := templateTokenizer(t)
	for _, g := range golden {
		tok, name := local, g.Template
		if !strings.HasSuffix(g.Template, ".jinja") {
			tok, name = realTokenizer(t, g.Template), ""
		}
		opts := ChatOptions{AddGenerationPrompt: g.Generation, TemplateName: name, Extra: g.Extra, Now: cases.Now}
		if g.Tools {
			opts.Tools = cases.Tools
		}
		got, err := tok.ApplyChatTemplate(toMessages(t, cases.Conversations[g.Conversation]), opts)
		label := g.Template + "/" + g.Conversation
		switch {
		case g.Error != nil:
			var te *TemplateError
			if !errors.As(err, &te) || !errors.Is(err, ErrTemplate) {
				t.Errorf("%s: got %q, %v; want a *TemplateError like %q", label, got, err, *g.Error)
			} else if !strings.Contains(err.Error(), *g.Error) && !strings.Contains(*g.Error, "undefined") {
				t.Errorf("%s: error %q does not carry %q", label, err, *g.Error)
			}
		case err != nil:
			t.Errorf("%s (gen=%v): %v", label, g.Generation, err)
		case got != *g.Output:
			t.Errorf("%s (gen=%v):\n got %q\nwant %q", label, g.Generation, got, *g.Output)
		}
	}
}
