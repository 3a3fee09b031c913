package openai_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type chatResponse struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func sessionChat(messages []map[string]string, extra ...any) map[string]any {
	b := map[string]any{"model": "tiny", "messages": messages, "max_tokens": 8, "ignore_eos": true}
	for i := 0; i+1 < len(extra); i += 2 {
		b[extra[i].(string)] = extra[i+1]
	}
	return b
}

func (f *fixture) chat(t *testing.T, body map[string]any, header ...string) (chatResponse, http.Header) {
	t.Helper()
	status, h, out := f.post(t, "/v1/chat/completions", body, header...)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, out)
	}
	var r chatResponse
	if err := json.Unmarshal(out, &r); err != nil || r.Usage == nil || len(r.Choices) != 1 {
		t.Fatalf("response %s: %v", out, err)
	}
	return r, h
}

// TestChatSessionSecondTurnCached: a chat's second turn, with the first
// answer rendered by the chat template, reports cached tokens; the
// session id is minted and returned when the client gives none.
func TestChatSessionSecondTurnCached(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	msgs := []map[string]string{
		{"role": "system", "content": "You are a terse assistant who answers in one line."},
		{"role": "user", "content": "What is the capital of France?"},
	}
	r1, h1 := f.chat(t, sessionChat(msgs))
	id := h1.Get("X-Session-ID")
	if len(id) != 36 {
		t.Fatalf("X-Session-ID %q: want a minted UUID", id)
	}
	msgs = append(msgs, map[string]string{"role": "assistant", "content": r1.Choices[0].Message.Content},
		map[string]string{"role": "user", "content": "And of Italy?"})
	r2, h2 := f.chat(t, sessionChat(msgs), "X-Session-ID", id)
	if h2.Get("X-Session-ID") != id {
		t.Fatalf("X-Session-ID %q on the second turn, want %q", h2.Get("X-Session-ID"), id)
	}
	if c := r2.Usage.PromptTokensDetails.CachedTokens; c == 0 || c >= r2.Usage.PromptTokens {
		t.Fatalf("second turn: cached_tokens %d of %d prompt tokens", c, r2.Usage.PromptTokens)
	}
	// The body field names the session too.
	msgs = append(msgs, map[string]string{"role": "assistant", "content": "Rome."}, map[string]string{"role": "user", "content": "Spain?"})
	r3, h3 := f.chat(t, sessionChat(msgs, "session_id", "my-chat"))
	if h3.Get("X-Session-ID") != "my-chat" || r3.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("session_id field: header %q, cached %d", h3.Get("X-Session-ID"), r3.Usage.PromptTokensDetails.CachedTokens)
	}
	// The session headers of llm-d and SGLang's router name it as well.
	for _, hdr := range []string{"X-Session-Token", "X-SMG-Routing-Key"} {
		_, h := f.chat(t, sessionChat(msgs), hdr, "routed-"+hdr)
		if got := h.Get("X-Session-ID"); got != "routed-"+hdr {
			t.Errorf("%s: session %q", hdr, got)
		}
	}
}

// TestSharedSystemPromptCached: a second user with the same system prompt
// and no session id reports cached tokens.
func TestSharedSystemPromptCached(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	system := strings.Repeat("Follow the house style guide carefully. ", 8)
	for i, q := range []string{"Name a fruit.", "Name a colour.", "Name a river."} {
		r, _ := f.chat(t, sessionChat([]map[string]string{{"role": "system", "content": system}, {"role": "user", "content": q}}))
		cached := r.Usage.PromptTokensDetails.CachedTokens
		if i > 0 && cached < 50 {
			t.Fatalf("user %d: cached_tokens %d of %d; the system prompt is shared", i, cached, r.Usage.PromptTokens)
		}
	}
}

// TestStreamingUsageCachedTokens: with stream_options.include_usage the
// final usage chunk carries cached_tokens.
func TestStreamingUsageCachedTokens(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	prompt := []int{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}
	f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 2, "session_id": "st"})
	status, h, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": append(prompt, 30, 31), "max_tokens": 3,
		"stream": true, "stream_options": map[string]any{"include_usage": true}, "session_id": "st"})
	if status != http.StatusOK || h.Get("X-Session-ID") != "st" {
		t.Fatalf("status %d, X-Session-ID %q: %s", status, h.Get("X-Session-ID"), body)
	}
	events := sseEvents(t, body)
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %v", events)
	}
	var last chatResponse
	if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil || last.Usage == nil {
		t.Fatalf("usage chunk %s: %v", events[len(events)-2], err)
	}
	if got := last.Usage.PromptTokensDetails.CachedTokens; got != len(prompt) {
		t.Fatalf("streamed cached_tokens %d, want %d", got, len(prompt))
	}
}

// TestBadSessionIDIs400: an over-long session id or one with control
// characters is a 400 naming session_id; the server keeps serving.
func TestBadSessionIDIs400(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, c := range []struct {
		body   map[string]any
		header []string
	}{
		{map[string]any{"model": "tiny", "prompt": "hi", "max_tokens": 2, "session_id": strings.Repeat("x", 129)}, nil},
		{map[string]any{"model": "tiny", "prompt": "hi", "max_tokens": 2, "session_id": "a\u0007b"}, nil},
		{map[string]any{"model": "tiny", "prompt": "hi", "max_tokens": 2}, []string{"X-Session-ID", "tab\there"}},
	} {
		status, _, body := f.post(t, "/v1/completions", c.body, c.header...)
		m := mustJSON(t, body)
		e, _ := m["error"].(map[string]any)
		if status != http.StatusBadRequest || e == nil || e["param"] != "session_id" {
			t.Fatalf("status %d: %s; want 400 with param session_id", status, body)
		}
	}
	if status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": "hi", "max_tokens": 2}); status != http.StatusOK {
		t.Fatalf("after bad ids: status %d: %s", status, body)
	}
}
