package openai_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/scheduler"
)

// badParamTools holds a good tool and one whose parameters use a keyword
// constrained decoding cannot enforce.
var badParamTools = []map[string]any{
	{"type": "function", "function": map[string]any{"name": "good", "parameters": map[string]any{"type": "object"}}},
	{"type": "function", "function": map[string]any{"name": "bad", "parameters": map[string]any{"type": "object",
		"properties": map[string]any{"when": map[string]any{"not": map[string]any{"type": "string"}}}}}},
}

func msgs(content any) []map[string]any {
	return []map[string]any{{"role": "user", "content": content}}
}

// TestMalformedRequests sends every kind of bad request at once, with a
// well-formed request alongside: each gets its status and an OpenAI-shaped
// body naming the problem, and the good request completes.
func TestMalformedRequests(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	chat := "/v1/chat/completions"
	cases := []struct {
		name   string
		path   string
		body   any
		header []string
		status int
		param  string // expected "param", "" for null
		want   string // substring of the message
	}{
		{"invalid JSON", chat, `{"model":"tiny",`, nil, 400, "", "invalid JSON"},
		{"not an object", chat, `[1,2]`, nil, 400, "", "JSON object"},
		{"trailing data", chat, `{"model":"tiny","messages":[{"role":"user","content":"hi"}]} {}`, nil, 400, "", "after the request object"},
		{"empty body", chat, ``, nil, 400, "", "empty"},
		{"wrong type max_tokens", chat, chatBody(map[string]any{"max_tokens": "ten"}), nil, 400, "max_tokens", "wrong type"},
		{"wrong type messages", chat, chatBody(map[string]any{"messages": "hi"}), nil, 400, "messages", "wrong type"},
		{"wrong type content", chat, chatBody(map[string]any{"messages": msgs(42)}), nil, 400, "messages.0.content", "string or an array"},
		{"wrong type stop", chat, chatBody(map[string]any{"stop": 7}), nil, 400, "stop", "string or an array"},
		{"unknown field", chat, chatBody(map[string]any{"frobnicate": true}), nil, 400, "frobnicate", "unknown or unsupported field"},
		{"missing model", chat, chatBody(map[string]any{"model": ""}), nil, 400, "model", "required"},
		{"empty messages", chat, chatBody(map[string]any{"messages": []any{}}), nil, 400, "messages", "at least one"},
		{"unknown role", chat, chatBody(map[string]any{"messages": []map[string]any{{"role": "wizard", "content": "x"}}}), nil, 400, "messages.0.role", "unknown role"},
		{"missing content", chat, chatBody(map[string]any{"messages": []map[string]any{{"role": "user"}}}), nil, 400, "messages.0.content", "no content"},
		{"image part", chat, chatBody(map[string]any{"messages": msgs([]map[string]any{{"type": "image_url", "image_url": map[string]string{"url": "x"}}})}), nil, 400, "messages.0.content.0.type", "text parts only"},
		{"negative max_tokens", chat, chatBody(map[string]any{"max_tokens": -1}), nil, 400, "max_tokens", "at least 1"},
		{"zero max_completion_tokens", chat, chatBody(map[string]any{"max_completion_tokens": 0}), nil, 400, "max_completion_tokens", "at least 1"},
		{"huge max_tokens", chat, chatBody(map[string]any{"max_tokens": 1 << 40}), nil, 400, "messages", "context length exceeded"},
		{"max_tokens beyond int", chat, `{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":1e40}`, nil, 400, "max_tokens", "wrong type"},
		{"temperature 5", chat, chatBody(map[string]any{"temperature": 5}), nil, 400, "temperature", "out of range"},
		{"top_p 0", chat, chatBody(map[string]any{"top_p": 0}), nil, 400, "top_p", "greater than 0"},
		{"top_p 2", chat, chatBody(map[string]any{"top_p": 2}), nil, 400, "top_p", "out of range"},
		{"n 9", chat, chatBody(map[string]any{"n": 9}), nil, 400, "n", "between 1 and 8"},
		{"n 0", chat, chatBody(map[string]any{"n": 0}), nil, 400, "n", "between 1 and 8"},
		{"tools not an array", chat, chatBody(map[string]any{"tools": map[string]any{"type": "function"}}), nil, 400, "tools", "invalid tool definition"},
		{"tool without name", chat, chatBody(map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": ""}}}}), nil, 400, "tools", "name"},
		{"tool parameters not a schema", chat, chatBody(map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "parameters": 3}}}}), nil, 400, "tools", "parameters"},
		{"tool parameters unsupported, auto", chat, chatBody(map[string]any{"tools": badParamTools}), nil, 400, "tools[1].function.parameters", `"not" at #/properties/when`},
		{"tool parameters unsupported, required", chat, chatBody(map[string]any{"tools": badParamTools, "tool_choice": "required"}), nil, 400, "tools[1].function.parameters", `function "bad"`},
		{"tool parameters unsupported, named", chat, chatBody(map[string]any{"tools": badParamTools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "bad"}}}), nil, 400, "tools[1].function.parameters", `"not" at #/properties/when`},
		{"tool parameters malformed, auto", chat, chatBody(map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object", "required": "x"}}}}}), nil, 400, "tools[0].function.parameters", "#/required"},
		{"tool_choice without tools", chat, chatBody(map[string]any{"tool_choice": "required"}), nil, 400, "tool_choice", "needs tools"},
		{"tool_choice unknown function", chat, chatBody(map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f"}}}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "g"}}}), nil, 400, "tool_choice", "not among the tools"},
		{"json schema unsupported keyword", chat, chatBody(map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": map[string]any{"type": "object", "patternProperties": map[string]any{}}}}}), nil, 400, "json_schema", "patternProperties"},
		{"json schema without name", chat, chatBody(map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"schema": map[string]any{}}}}), nil, 400, "response_format.json_schema.name", "required"},
		{"response_format type", chat, chatBody(map[string]any{"response_format": map[string]any{"type": "xml"}}), nil, 400, "response_format.type", "want text"},
		{"logit_bias key", chat, chatBody(map[string]any{"logit_bias": map[string]int{"abc": 10}}), nil, 400, "logit_bias", "not a token id"},
		{"logit_bias value", chat, chatBody(map[string]any{"logit_bias": map[string]int{"5": 200}}), nil, 400, "logit_bias", "between -100 and 100"},
		{"logit_bias outside vocabulary", chat, chatBody(map[string]any{"logit_bias": map[string]int{"99999999": 1}}), nil, 400, "logit_bias", "outside the vocabulary"},
		{"presence_penalty", chat, chatBody(map[string]any{"presence_penalty": 2.5}), nil, 400, "presence_penalty", "out of range"},
		{"top_logprobs 21", chat, chatBody(map[string]any{"logprobs": true, "top_logprobs": 21}), nil, 400, "top_logprobs", "between 0 and 20"},
		{"top_logprobs without logprobs", chat, chatBody(map[string]any{"top_logprobs": 2}), nil, 400, "top_logprobs", "needs logprobs"},
		{"stream_options without stream", chat, chatBody(map[string]any{"stream_options": map[string]any{"include_usage": true}}), nil, 400, "stream_options", "only allowed"},
		{"unknown model", chat, chatBody(map[string]any{"model": "gpt-9"}), nil, 404, "model", `model "gpt-9" not found`},
		{"unknown tier in body", chat, chatBody(map[string]any{"priority": "urgent"}), nil, 400, "priority", "unknown priority"},
		{"unknown tier in header", chat, chatBody(nil), []string{"X-Priority", "asap"}, 400, "priority", "unknown priority"},
		{"invalid UTF-8", chat, []byte("{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"), nil, 400, "", "not valid UTF-8"},
		{"20 MB body", chat, `{"model":"tiny","messages":[{"role":"user","content":"` + strings.Repeat("a", 20<<20) + `"}]}`, nil, 413, "", "limit"},
		{"several prompts", "/v1/completions", map[string]any{"model": "tiny", "prompt": []string{"a", "b"}}, nil, 400, "prompt", "only one"},
		{"empty prompt", "/v1/completions", map[string]any{"model": "tiny", "prompt": ""}, nil, 400, "prompt", "empty"},
		{"token outside vocabulary", "/v1/completions", map[string]any{"model": "tiny", "prompt": []int{1, 999999}, "max_tokens": 2}, nil, 400, "prompt", "outside the vocabulary"},
		{"echo", "/v1/completions", map[string]any{"model": "tiny", "prompt": "a", "echo": true}, nil, 400, "echo", "not supported"},
		{"completion logprobs 6", "/v1/completions", map[string]any{"model": "tiny", "prompt": "a", "logprobs": 6}, nil, 400, "logprobs", "between 0 and 5"},
	}
	var wg sync.WaitGroup
	good := make(chan string, 1)
	wg.Go(func() {
		status, _, body := f.post(t, chat, chatBody(map[string]any{"max_tokens": 32}))
		if status != http.StatusOK {
			good <- string(body)
			return
		}
		good <- ""
	})
	for _, c := range cases {
		wg.Go(func() {
			status, _, body := f.post(t, c.path, c.body, c.header...)
			if status != c.status {
				t.Errorf("%s: status %d, want %d: %.300s", c.name, status, c.status, body)
				return
			}
			e, ok := mustJSON(t, body)["error"].(map[string]any)
			if !ok {
				t.Errorf("%s: no error object: %.300s", c.name, body)
				return
			}
			msg, _ := e["message"].(string)
			if _, ok := e["type"].(string); !ok || !strings.Contains(msg, c.want) {
				t.Errorf("%s: error %v; want a type and a message with %q", c.name, e, c.want)
			}
			if p, _ := e["param"].(string); p != c.param {
				t.Errorf("%s: param %v, want %q", c.name, e["param"], c.param)
			}
		})
	}
	wg.Wait()
	if msg := <-good; msg != "" {
		t.Fatalf("the well-formed request failed: %s", msg)
	}
}

// TestQueueFull: with one batch slot and a queue of one, a third request
// is refused at once with 429 and Retry-After.
func TestQueueFull(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		sim:    []enginetest.SimOption{enginetest.WithMaxBatch(1), enginetest.WithStepTime(5*time.Millisecond, 0)},
		server: []mlxserving.Option{mlxserving.WithSchedulerOptions(scheduler.WithMaxQueued(1))},
	})
	var wg sync.WaitGroup
	statuses := make(chan int, 6)
	retryAfter := make(chan string, 6)
	for range 6 {
		wg.Go(func() {
			status, hdr, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": []int{1, 2}, "max_tokens": 20, "ignore_eos": true})
			statuses <- status
			if status == http.StatusTooManyRequests {
				retryAfter <- hdr.Get("Retry-After")
				if !strings.Contains(string(body), `"type":"rate_limit_error"`) {
					t.Errorf("429 body: %s", body)
				}
			}
		})
	}
	wg.Wait()
	close(statuses)
	close(retryAfter)
	counts := map[int]int{}
	for s := range statuses {
		counts[s]++
	}
	if counts[429] == 0 || counts[200] == 0 || counts[200]+counts[429] != 6 {
		t.Fatalf("statuses %v: want some 200 and some 429", counts)
	}
	for ra := range retryAfter {
		if ra == "" || ra == "0" {
			t.Errorf("429 with Retry-After %q", ra)
		}
	}
}

// TestDisconnectFreesKV: a client that goes away mid-stream cancels its
// generation, and the engine's sequence (and its KV) is freed.
func TestDisconnectFreesKV(t *testing.T) {
	f := newFixture(t, fixtureOpts{sim: []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.ts.URL+"/v1/completions",
		strings.NewReader(`{"model":"tiny","prompt":[1,2,3],"max_tokens":400,"ignore_eos":true,"stream":true}`))
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	if n := f.sim.Stats().OpenSequences; n != 1 {
		t.Fatalf("open sequences while streaming: %d, want 1", n)
	}
	cancel()
	_ = resp.Body.Close()
	waitFor(t, "the sequence to be freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
	if steps := f.sim.Stats().Steps; steps >= 400 {
		t.Fatalf("generation ran to the end (%d steps) despite the disconnect", steps)
	}
}

// TestSlowReaderDoesNotBlock: a client that stops reading its stream holds
// up only its own writes; the batcher runs its sequence to the end and
// serves other requests meanwhile.
func TestSlowReaderDoesNotBlock(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	req, _ := http.NewRequest(http.MethodPost, f.ts.URL+"/v1/completions",
		strings.NewReader(`{"model":"tiny","prompt":[1,2,3],"max_tokens":500,"ignore_eos":true,"stream":true,"logprobs":0}`))
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // never read
	status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": []int{4, 5}, "max_tokens": 50, "ignore_eos": true})
	if status != http.StatusOK {
		t.Fatalf("second request: %d %s", status, body)
	}
	waitFor(t, "the unread stream's generation to finish", func() bool { return f.sim.Stats().OpenSequences == 0 })
}
