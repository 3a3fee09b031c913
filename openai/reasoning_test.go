package openai_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// thinkingTemplate is the test model's template with a generation prompt
// that opens a <think> block as DeepSeek-R1's does, or, with Qwen3's
// enable_thinking false, closes an empty one.
const thinkingTemplate = "{{- bos_token }}" +
	"{%- for message in messages %}" +
	"{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}" +
	"{%- endfor %}" +
	"{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}" +
	"{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}" +
	"{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"

type reasoningReply struct {
	Choices []struct {
		Message struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"message"`
		Delta struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// reasoningWhole posts a non-streamed chat request and returns its reasoning and
// content (reasoning nil when the key is absent).
func (f *fixture) reasoningWhole(t *testing.T, extra map[string]any) (*string, string) {
	t.Helper()
	status, _, body := f.post(t, "/v1/chat/completions", chatBody(extra))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	var r reasoningReply
	if err := json.Unmarshal(body, &r); err != nil || len(r.Choices) != 1 || r.Choices[0].Message.Content == nil {
		t.Fatalf("reply %s: %v", body, err)
	}
	if r.Usage == nil || r.Usage.CompletionTokens != 8 {
		t.Errorf("usage counts tokens, reasoning included: %s", body)
	}
	return r.Choices[0].Message.ReasoningContent, *r.Choices[0].Message.Content
}

// reasoningStream posts a streamed chat request and returns the deltas'
// reasoning and content, joined.
func (f *fixture) reasoningStream(t *testing.T, extra map[string]any) (string, string) {
	t.Helper()
	extra["stream"] = true
	status, _, body := f.post(t, "/v1/chat/completions", chatBody(extra))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	var reasoning, content strings.Builder
	for _, ev := range sseEvents(t, body) {
		if ev == "[DONE]" {
			break
		}
		var r reasoningReply
		if err := json.Unmarshal([]byte(ev), &r); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		for _, c := range r.Choices {
			if c.Delta.ReasoningContent != nil {
				reasoning.WriteString(*c.Delta.ReasoningContent)
			}
			if c.Delta.Content != nil {
				content.WriteString(*c.Delta.Content)
			}
		}
	}
	return reasoning.String(), content.String()
}

// TestReasoningContent serves a model whose template opens <think> in the
// prompt: the reply (the simulated engine's tokens, no </think> among
// them) is all reasoning, whole and streamed; separate_reasoning false
// returns it as content; chat_template_kwargs reach the template, whose
// closed block makes the reply content.
func TestReasoningContent(t *testing.T) {
	f := newFixture(t, fixtureOpts{dir: templateCheckpoint(t, thinkingTemplate)})
	_, raw := f.reasoningWhole(t, map[string]any{"separate_reasoning": false})
	if raw == "" {
		t.Fatal("empty reply")
	}
	reasoning, content := f.reasoningWhole(t, nil)
	if reasoning == nil || *reasoning != raw || content != "" {
		t.Errorf("whole: reasoning %v, content %q; want reasoning %q", reasoning, content, raw)
	}
	if r, c := f.reasoningStream(t, map[string]any{}); r != raw || c != "" {
		t.Errorf("streamed: reasoning %q, content %q; want reasoning %q", r, c, raw)
	}
	if r, c := f.reasoningStream(t, map[string]any{"separate_reasoning": false}); r != "" || c != raw {
		t.Errorf("streamed, not separated: reasoning %q, content %q; want content %q", r, c, raw)
	}

	off := map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}}
	reasoning, content = f.reasoningWhole(t, off)
	if reasoning != nil || content == "" {
		t.Errorf("enable_thinking false: reasoning %v, content %q", reasoning, content)
	}
	if r, c := f.reasoningStream(t, off); r != "" || c != content {
		t.Errorf("enable_thinking false, streamed: reasoning %q, content %q; want content %q", r, c, content)
	}
}

// TestNoReasoningContent: a model whose template has no <think> gets no
// reasoning_content key.
func TestNoReasoningContent(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	_, _, body := f.post(t, "/v1/chat/completions", chatBody(nil))
	if strings.Contains(string(body), "reasoning_content") {
		t.Errorf("reasoning_content from a model without reasoning: %s", body)
	}
}

// TestChatTemplateKwargsRefused: chat_template_kwargs must be an object
// and must not replace the variables the request sets.
func TestChatTemplateKwargsRefused(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, c := range []struct {
		kwargs any
		param  string
	}{
		{"enable_thinking", "chat_template_kwargs"},
		{[]any{1}, "chat_template_kwargs"},
		{7, "chat_template_kwargs"},
		{map[string]any{"messages": []any{}}, "chat_template_kwargs.messages"},
		{map[string]any{"enable_thinking": true, "bos_token": "x"}, "chat_template_kwargs.bos_token"},
	} {
		status, _, body := f.post(t, "/v1/chat/completions", chatBody(map[string]any{"chat_template_kwargs": c.kwargs}))
		var e struct {
			Error struct {
				Type  string `json:"type"`
				Param string `json:"param"`
			} `json:"error"`
		}
		if status != http.StatusBadRequest || json.Unmarshal(body, &e) != nil ||
			e.Error.Param != c.param || e.Error.Type != "invalid_request_error" {
			t.Errorf("%v: %d %s; want 400 naming %s", c.kwargs, status, body, c.param)
		}
	}
	// Numbers reach the template as Python's json.loads gives them.
	status, _, body := f.post(t, "/v1/chat/completions", chatBody(map[string]any{"chat_template_kwargs": map[string]any{"n": 3, "x": 1.5, "l": []any{1, map[string]any{"y": 2}}}}))
	if status != http.StatusOK {
		t.Errorf("kwargs object refused: %d %s", status, body)
	}
}
