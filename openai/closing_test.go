package openai_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestStructuredCloseWithinMaxTokens: a json_schema reply whose array
// could grow past max_tokens (the AI SDK's output: 'array', no maxItems)
// is a complete document for every max_tokens from the schema's minimum
// up; one the budget closed ends with "length" and reports its
// closing_tokens. max_tokens below the minimum is a 400 on max_tokens
// naming it, and "close_within_max_tokens": false cuts the reply.
func TestStructuredCloseWithinMaxTokens(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	schema := `{"type":"object","properties":{"elements":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"score":{"type":"number"}},"required":["name","score"],"additionalProperties":false}}},"required":["elements"],"additionalProperties":false}`
	ask := func(max int, extra string) (int, []byte) {
		body := fmt.Sprintf(`{"model":"tiny","max_tokens":%d,"temperature":1,"seed":%d,"messages":[{"role":"user","content":"list"}],
			"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":%s}}%s}`, max, max, schema, extra)
		status, _, b := f.post(t, "/v1/chat/completions", body)
		return status, b
	}
	type reply struct {
		Choices []struct {
			Message      struct{ Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			Details *struct {
				ClosingTokens int `json:"closing_tokens"`
			} `json:"completion_tokens_details"`
		}
		Error struct{ Param, Message string }
	}
	status, b := ask(2, "")
	var r reply
	if err := json.Unmarshal(b, &r); err != nil || status != http.StatusBadRequest || r.Error.Param != "max_tokens" || !strings.Contains(r.Error.Message, "shortest document takes") {
		t.Fatalf("max_tokens 2: %d %s: want a 400 on max_tokens naming the minimum", status, b)
	}
	var lo int
	if _, err := fmt.Sscanf(r.Error.Message[strings.Index(r.Error.Message, "takes ")+len("takes "):], "%d", &lo); err != nil {
		t.Fatalf("%s: %v", r.Error.Message, err)
	}
	closed := 0
	for max := lo; max < lo+40; max += 3 {
		status, b := ask(max, "")
		var r reply
		if err := json.Unmarshal(b, &r); err != nil || status != http.StatusOK || len(r.Choices) != 1 {
			t.Fatalf("max_tokens %d: %d %s", max, status, b)
		}
		var doc struct{ Elements []struct{ Name string } }
		if err := json.Unmarshal([]byte(r.Choices[0].Message.Content), &doc); err != nil {
			t.Fatalf("max_tokens %d: content %q does not parse: %v", max, r.Choices[0].Message.Content, err)
		}
		if r.Usage.Details != nil && r.Usage.Details.ClosingTokens > 0 {
			closed++
			if r.Choices[0].FinishReason != "length" {
				t.Errorf("max_tokens %d: closed by the budget, finish %q: want length", max, r.Choices[0].FinishReason)
			}
		}
	}
	if closed == 0 {
		t.Errorf("no reply was closed by its budget")
	}
	status, b = ask(lo, `,"close_within_max_tokens":false`)
	if err := json.Unmarshal(b, &r); err != nil || status != http.StatusOK || r.Choices[0].FinishReason != "length" || json.Valid([]byte(r.Choices[0].Message.Content)) {
		t.Fatalf("close_within_max_tokens false: %d %s: want a cut reply", status, b)
	}
}
