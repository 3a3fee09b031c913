package openai

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/toolcall"
)

// format writes one request's responses: a chat or text completion, as
// SSE chunks or one body.
type format struct {
	chat         bool
	id           string
	created      int64
	model        string
	logprobs     bool
	includeUsage bool
	prefix       []byte      // a stream chunk up to and including `"choices":[`
	textOffset   int         // completions' logprobs text_offset
	tools        *toolStream // set when replies are parsed for tool calls
	index        int         // the choice's index (n > 1)
	usage        *api.Usage  // the final chunk's usage, once received
	generated    int         // tokens received so far, for a stream cut short
	tokenIDs     bool        // return_token_ids: every token's id in its streamed chunk
	// reasoning splits a reasoning model's <think> block off the content;
	// nil when the reply has none to split.
	reasoning *toolcall.ReasoningParser
}

// openChoice appends `{"index":N` for the format's choice.
func (f *format) openChoice(b []byte) []byte {
	b = append(b, `{"index":`...)
	return strconv.AppendInt(b, int64(f.index), 10)
}

func newFormat(chat bool, id string, created int64, model string, logprobs, includeUsage bool) *format {
	f := &format{chat: chat, id: id, created: created, model: model, logprobs: logprobs, includeUsage: includeUsage}
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	b := append([]byte(nil), `data: {"id":`...)
	b = appendString(b, id)
	b = append(b, `,"object":"`+object+`","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = appendString(b, model)
	f.prefix = append(b, `,"choices":[`...)
	return f
}

// roleChunk is the chat stream's first chunk, carrying the role.
func (f *format) roleChunk(b []byte) []byte {
	b = append(b, f.prefix...)
	b = f.openChoice(b)
	b = append(b, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
	return f.end(b)
}

// tokenChunk is one piece of generated text (with the token's logprob
// when asked for); for a chat reply, reasoning is the piece's reasoning
// text, c.Text its content.
func (f *format) tokenChunk(b []byte, c api.Chunk, reasoning string) []byte {
	b = append(b, f.prefix...)
	if f.chat {
		b = append(f.openChoice(b), `,"delta":`...)
		b = appendDelta(b, reasoning, c.Text)
		b = append(b, `,"logprobs":`...)
	} else {
		b = append(f.openChoice(b), `,"text":`...)
		b = appendString(b, c.Text)
		b = append(b, `,"logprobs":`...)
	}
	if f.logprobs && c.HasToken {
		lp, _ := json.Marshal(f.logprobsOf([]api.Chunk{c}))
		b = append(b, lp...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":null`...)
	if f.tokenIDs && c.HasToken {
		b = strconv.AppendInt(append(b, `,"token_ids":[`...), int64(c.Token), 10)
		b = append(b, ']')
	}
	b = append(b, "}]"...)
	return f.end(b)
}

// finishChunk ends the choice with its finish reason.
func (f *format) finishChunk(b []byte, finish api.FinishReason) []byte {
	b = append(b, f.prefix...)
	if f.chat {
		b = append(f.openChoice(b), `,"delta":{},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(f.openChoice(b), `,"text":"","logprobs":null,"finish_reason":`...)
	}
	b = appendString(b, string(finish))
	b = append(b, "}]"...)
	return f.end(b)
}

// usageChunk is stream_options.include_usage's last chunk: no choices.
func (f *format) usageChunk(b []byte, u *api.Usage) []byte {
	b = append(b, f.prefix...)
	b = append(b, `],"usage":`...)
	ub, _ := json.Marshal(usageOf(u))
	b = append(b, ub...)
	return append(b, "}\n\n"...)
}

func (f *format) end(b []byte) []byte {
	if f.includeUsage {
		b = append(b, `,"usage":null`...)
	}
	return append(b, "}\n\n"...)
}

// logprobsOf renders the chunks' logprobs in the endpoint's shape. The
// token text is the text the token completed (empty while a multi-byte
// character is incomplete).
func (f *format) logprobsOf(chunks []api.Chunk) any {
	if f.chat {
		content := make([]chatLogprob, 0, len(chunks))
		for _, c := range chunks {
			top := make([]chatLogprob, 0, len(c.Top))
			for _, t := range c.Top {
				top = append(top, chatLogprob{Token: validText(t.Text), Logprob: finite(t.Logprob), Bytes: []byte(t.Text)})
			}
			content = append(content, chatLogprob{Token: c.Text, Logprob: finite(c.Logprob), Bytes: []byte(c.Text), TopLogprobs: top})
		}
		return map[string]any{"content": content}
	}
	lp := textLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TextOffset: []int{}}
	for _, c := range chunks {
		lp.Tokens = append(lp.Tokens, c.Text)
		lp.TokenLogprobs = append(lp.TokenLogprobs, finite(c.Logprob))
		lp.TextOffset = append(lp.TextOffset, f.textOffset)
		f.textOffset += len(c.Text)
		if len(c.Top) > 0 {
			top := make(map[string]float64, len(c.Top))
			for _, t := range c.Top {
				top[validText(t.Text)] = finite(t.Logprob)
			}
			lp.TopLogprobs = append(lp.TopLogprobs, top)
		}
	}
	return lp
}

// validText is a token's text as valid UTF-8: a token holding part of a
// character shows the replacement character (its bytes stay exact).
func validText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

type chatLogprob struct {
	Token       string        `json:"token"`
	Logprob     float64       `json:"logprob"`
	Bytes       []byte        `json:"bytes"`
	TopLogprobs []chatLogprob `json:"top_logprobs"`
}

// MarshalJSON writes bytes as an array of numbers, as OpenAI does.
func (c chatLogprob) MarshalJSON() ([]byte, error) {
	ints := make([]int, len(c.Bytes))
	for i, v := range c.Bytes {
		ints[i] = int(v)
	}
	type plain struct {
		Token       string        `json:"token"`
		Logprob     json.Number   `json:"logprob"`
		Bytes       []int         `json:"bytes"`
		TopLogprobs []chatLogprob `json:"top_logprobs"`
	}
	lp := json.Number(strconv.FormatFloat(c.Logprob, 'g', -1, 32)) // the engine's float32, without float64 noise
	if c.TopLogprobs == nil {
		// Entries inside top_logprobs have no list of their own.
		type entry struct {
			Token   string      `json:"token"`
			Logprob json.Number `json:"logprob"`
			Bytes   []int       `json:"bytes"`
		}
		return json.Marshal(entry{c.Token, lp, ints})
	}
	return json.Marshal(plain{c.Token, lp, ints, c.TopLogprobs})
}

type textLogprobs struct {
	Tokens        []string  `json:"tokens"`
	TokenLogprobs []float64 `json:"token_logprobs"`
	TopLogprobs   []any     `json:"top_logprobs"`
	TextOffset    []int     `json:"text_offset"`
}

// finite keeps JSON valid: OpenAI reports impossible tokens as -9999.
func finite(lp float32) float64 {
	if math.IsInf(float64(lp), 0) || math.IsNaN(float64(lp)) {
		return -9999
	}
	return float64(lp)
}

type usageBody struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// CompletionTokensDetails is set when jump-forward decoding appended
	// some of the completion tokens (api.Usage.ForcedTokens) or the
	// budget closed a structured reply (api.Usage.ClosingTokens).
	CompletionTokensDetails *completionDetails `json:"completion_tokens_details,omitempty"`
}

type completionDetails struct {
	ForcedTokens  int `json:"forced_tokens"`
	ClosingTokens int `json:"closing_tokens,omitempty"`
}

func usageOf(u *api.Usage) usageBody {
	var b usageBody
	if u == nil {
		return b
	}
	b.PromptTokens, b.CompletionTokens = u.PromptTokens, u.CompletionTokens
	b.TotalTokens = u.PromptTokens + u.CompletionTokens
	b.PromptTokensDetails.CachedTokens = u.CachedTokens
	if u.ForcedTokens > 0 || u.ClosingTokens > 0 {
		b.CompletionTokensDetails = &completionDetails{ForcedTokens: u.ForcedTokens, ClosingTokens: u.ClosingTokens}
	}
	return b
}

// body is the whole non-streamed response.
func (f *format) body(text string, chunks []api.Chunk, finish api.FinishReason, u *api.Usage) any {
	var lp any
	if f.logprobs {
		lp = f.logprobsOf(chunks)
	}
	choice := map[string]any{"index": f.index, "logprobs": lp, "finish_reason": finish}
	object := "text_completion"
	if f.chat {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text, "refusal": nil}
	} else {
		choice["text"] = text
	}
	return map[string]any{
		"id": f.id, "object": object, "created": f.created, "model": f.model,
		"choices": []any{choice}, "usage": usageOf(u), "system_fingerprint": nil,
	}
}

// toolBody is the whole non-streamed response of a reply that called
// tools: finish is "tool_calls", or "length" for a call cut short.
func (f *format) toolBody(content string, calls []toolCall, chunks []api.Chunk, finish api.FinishReason, u *api.Usage) any {
	body := f.body(content, chunks, finish, u).(map[string]any)
	msg := body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if content == "" {
		msg["content"] = nil
	}
	msg["tool_calls"] = calls
	return body
}

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			b = appendEscaped(b, c)
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			if r == utf8.RuneError {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, `\u202`...)
				b = append(b, "0123456789abcdef"[r&0xf])
			}
			start = i + n
		}
		i += n
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func appendEscaped(b []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(b, '\\', c)
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	const hex = "0123456789abcdef"
	return append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
}
