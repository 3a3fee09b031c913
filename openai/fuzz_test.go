package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/api"
)

// FuzzDecodeRequest: any body, for either endpoint, is refused with an
// OpenAI-shaped 400 or 413 or becomes a request the library can take
// (model set, at least one message or prompt token, max_tokens at least 1,
// a valid tier). Decoding never panics and never maps to a 5xx.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_completion_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":1,"priority":"critical","stop":["a","b"],"seed":-1}`,
		`{"model":"m","prompt":["x"],"logprobs":0,"temperature":0,"top_p":1,"top_k":5,"min_p":0.1,"repetition_penalty":1.1}`,
		`{"model":"m","messages":[],"n":2}`, `[]`, `null`, `{"model":1}`, `{"model":"m","stop":7}`,
		`{"model":"m","prompt":"x"} {}`, "{\"model\":\"m\",\"prompt\":\"\xff\"}", `{"model":"m","prompt":[[1]]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, `{"model":"m","prompt":[[]]}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
		r.Header.Set("X-Priority", "low")
		w := httptest.NewRecorder()
		err := decodeOne(w, r, chat)
		if err == nil {
			return
		}
		e := toAPIError(err)
		if e.status != http.StatusBadRequest && e.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("body %q: status %d for %v", body, e.status, err)
		}
		rec := httptest.NewRecorder()
		writeError(rec, err)
		var out struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if json.Unmarshal(rec.Body.Bytes(), &out) != nil || out.Error.Message == "" || out.Error.Type == "" {
			t.Fatalf("error body %q is not OpenAI-shaped", rec.Body)
		}
	})
}

// decodeOne runs a body through the handler's decoding and conversion and
// checks what a successful conversion holds.
func decodeOne(w http.ResponseWriter, r *http.Request, chat bool) error {
	body, err := readBody(w, r, 1<<16)
	if err != nil {
		return err
	}
	var p api.Params
	var model string
	if chat {
		var req chatRequest
		if err := decodeStrict(body, &req); err != nil {
			return err
		}
		cr, err := req.chat(r, 16)
		if err != nil {
			return err
		}
		if len(cr.Messages) == 0 {
			return errors.New("BUG: chat request without messages accepted")
		}
		p, model = cr.Params, cr.Model
	} else {
		var req completionRequest
		if err := decodeStrict(body, &req); err != nil {
			return err
		}
		gr, err := req.completion(r, 16)
		if err != nil {
			return err
		}
		if gr.Prompt == "" && len(gr.PromptTokens) == 0 {
			return errors.New("BUG: completion without a prompt accepted")
		}
		p, model = gr.Params, gr.Model
	}
	if model == "" || p.MaxTokens < 1 || !p.Priority.Valid() || p.Sampling.Validate() != nil {
		return errors.New("BUG: invalid request accepted")
	}
	return nil
}

// FuzzSSERoundTrip: whatever text, model name and logprob a stream
// carries, every event the SSE writer sends is one "data:" line of valid
// JSON, and the deltas decode to the text the chunks held (as
// encoding/json would carry it), ending with the finish reason and
// [DONE].
func FuzzSSERoundTrip(f *testing.F) {
	f.Add("Hello", ", world", "tiny", float32(-0.5), true, true, true)
	f.Add("line\nbreak\r\n", "\"quoted\" \\ </script>", "m\u2028odel", float32(math.NaN()), false, true, false)
	f.Add("\xff\xfe", "\u00e9\U0001F355\x00\x1f", "\x7f", float32(math.Inf(-1)), true, false, true)
	f.Fuzz(func(t *testing.T, a, b, model string, lp float32, chat, usage, logprobs bool) {
		rec := httptest.NewRecorder()
		fm := newFormat(chat, "id-1", 1, model, logprobs, usage)
		s := &sseWriter{w: rec, rc: http.NewResponseController(rec), buf: make([]byte, 0, 512)}
		for i, c := range []api.Chunk{
			{Text: a, Token: 1, HasToken: true, Logprob: lp},
			{Text: b, Token: 2, HasToken: true, Logprob: lp},
			{Finish: api.FinishStop, Usage: &api.Usage{PromptTokens: 3, CompletionTokens: 2}},
		} {
			if err := s.chunk(fm, c); err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
		}
		if err := s.send(append(s.buf[:0], "data: [DONE]\n\n"...)); err != nil {
			t.Fatal(err)
		}
		events := strings.Split(strings.TrimSuffix(rec.Body.String(), "\n\n"), "\n\n")
		if events[len(events)-1] != "data: [DONE]" {
			t.Fatalf("last event %q", events[len(events)-1])
		}
		var text, finish string
		sawUsage := false
		for _, ev := range events[:len(events)-1] {
			data, ok := strings.CutPrefix(ev, "data: ")
			if !ok || strings.ContainsAny(data, "\r\n") {
				t.Fatalf("event %q is not one data line", ev)
			}
			var m struct {
				Model   string `json:"model"`
				Choices []struct {
					Text  *string `json:"text"`
					Delta struct {
						Content *string `json:"content"`
					} `json:"delta"`
					Finish *string `json:"finish_reason"`
				} `json:"choices"`
				Usage *struct {
					Total int `json:"total_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(data), &m); err != nil {
				t.Fatalf("event %q: %v", data, err)
			}
			if m.Model != viaJSON(model) {
				t.Fatalf("model %q, want %q", m.Model, viaJSON(model))
			}
			if m.Usage != nil {
				sawUsage = m.Usage.Total == 5
			}
			for _, c := range m.Choices {
				switch {
				case c.Delta.Content != nil:
					text += *c.Delta.Content
				case c.Text != nil:
					text += *c.Text
				}
				if c.Finish != nil {
					finish = *c.Finish
				}
			}
		}
		if want := viaJSON(a) + viaJSON(b); text != want {
			t.Fatalf("streamed %q, want %q", text, want)
		}
		if finish != "stop" || sawUsage != usage {
			t.Fatalf("finish %q, usage seen %v (asked %v)", finish, sawUsage, usage)
		}
	})
}

// viaJSON is s as a JSON string carries it (invalid UTF-8 replaced).
func viaJSON(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}

// TestNestedPromptRefusedAtOnce: a prompt nested many arrays deep with a
// large payload inside is refused as it is found, not unwrapped one level
// at a time (each level re-parsed the rest: quadratic in the body).
func TestNestedPromptRefusedAtOnce(t *testing.T) {
	inner := strings.Repeat("1,", 200000) + "1"
	body := `{"model":"m","prompt":` + strings.Repeat("[", 5000) + inner + strings.Repeat("]", 5000) + `}`
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	var req completionRequest
	if err := decodeStrict([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	_, err := req.completion(r, 16)
	var e *apiError
	if !errors.As(err, &e) || e.status != http.StatusBadRequest || e.Param == nil || *e.Param != "prompt" {
		t.Fatalf("nested prompt: %v", err)
	}
	for _, ok := range []string{`"x"`, `[1,2]`, `["x"]`, `[[1,2]]`} {
		var req completionRequest
		_ = decodeStrict([]byte(`{"model":"m","prompt":`+ok+`}`), &req)
		if _, err := req.completion(r, 16); err != nil {
			t.Errorf("prompt %s: %v", ok, err)
		}
	}
}
