package httpbackend

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/mlxserving/mlxserving/api"
)

// body is the JSON of a completion or chat completion request. Fields an
// upstream may not know are sent only when set, so a plain OpenAI-style
// server sees a plain request.
type body struct {
	Model         string             `json:"model"`
	Prompt        any                `json:"prompt,omitempty"`
	Messages      []message          `json:"messages,omitempty"`
	Tools         []map[string]any   `json:"tools,omitempty"`
	MaxTokens     int                `json:"max_tokens"`
	Temperature   float32            `json:"temperature"`
	TopP          float32            `json:"top_p,omitempty"`
	TopK          int                `json:"top_k,omitempty"`
	MinP          float32            `json:"min_p,omitempty"`
	RepPenalty    float32            `json:"repetition_penalty,omitempty"`
	Seed          *int64             `json:"seed,omitempty"`
	Stop          []string           `json:"stop,omitempty"`
	IgnoreEOS     bool               `json:"ignore_eos,omitempty"`
	User          string             `json:"user,omitempty"`
	KeepAlive     string             `json:"keep_alive,omitempty"`
	Cache         bool               `json:"cache,omitempty"`
	ChatLogprobs  bool               `json:"logprobs,omitempty"`
	Presence      float32            `json:"presence_penalty,omitempty"`
	Frequency     float32            `json:"frequency_penalty,omitempty"`
	LogitBias     map[string]float32 `json:"logit_bias,omitempty"`
	Format        *responseFormat    `json:"response_format,omitempty"`
	Resume        []int32            `json:"resume,omitempty"`
	TokenIDs      bool               `json:"return_token_ids,omitempty"`
	Stream        bool               `json:"stream"`
	StreamOptions streamOptions      `json:"stream_options"`
}

// responseFormat is OpenAI's structured-output request: the output is one
// JSON document matching the schema.
type responseFormat struct {
	Type       string     `json:"type"`
	JSONSchema jsonSchema `json:"json_schema"`
}

type jsonSchema struct {
	Name   string          `json:"name"`
	Schema json.RawMessage `json:"schema"`
	Strict bool            `json:"strict"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type message struct {
	Role       string           `json:"role"`
	Content    string           `json:"content"`
	Name       string           `json:"name,omitempty"`
	ToolCalls  []map[string]any `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"`
}

func paramsBody(model string, p api.Params, resume bool) body {
	if p.Adapter != "" { // over the wire an adapter is the model asked for
		model = p.Adapter
	}
	b := body{Resume: p.Resume, TokenIDs: resume,
		Model: model, MaxTokens: p.MaxTokens, Temperature: p.Sampling.Temperature,
		TopP: p.Sampling.TopP, TopK: p.Sampling.TopK, MinP: p.Sampling.MinP,
		RepPenalty: p.Sampling.RepetitionPenalty, Stop: p.Stop, IgnoreEOS: p.IgnoreEOS,
		User: p.Client, Cache: p.Cache, Stream: true, StreamOptions: streamOptions{IncludeUsage: true},
	}
	if p.Sampling.HasSeed {
		s := int64(p.Sampling.Seed)
		b.Seed = &s
	}
	b.Presence, b.Frequency = p.Sampling.PresencePenalty, p.Sampling.FrequencyPenalty
	if len(p.Sampling.LogitBias) > 0 {
		b.LogitBias = make(map[string]float32, len(p.Sampling.LogitBias))
		for id, v := range p.Sampling.LogitBias {
			b.LogitBias[strconv.Itoa(int(id))] = v
		}
	}
	if len(p.JSONSchema) > 0 {
		// Sent as json_schema whatever it came as (json_object arrives as
		// the schema of any object): the upstream constrains the output
		// as the local Server would.
		b.Format = &responseFormat{Type: "json_schema", JSONSchema: jsonSchema{Name: "output", Schema: p.JSONSchema, Strict: true}}
	}
	if p.KeepAlive != nil {
		b.KeepAlive = p.KeepAlive.String()
	}
	return b
}

// completionBody is the /v1/completions request for req; resume asks
// for token ids (WithResume).
func completionBody(req api.Request, resume bool) ([]byte, error) {
	b := paramsBody(req.Model, req.Params, resume)
	if len(req.PromptTokens) > 0 {
		b.Prompt = req.PromptTokens
	} else {
		b.Prompt = req.Prompt
	}
	if req.Sampling.Logprobs {
		zero := 0
		return marshalWith(b, "logprobs", &zero)
	}
	return json.Marshal(b)
}

// marshalWith encodes b with one more field (completions' integer
// "logprobs", which chat requests spell as a boolean).
func marshalWith(b body, key string, v any) ([]byte, error) {
	raw, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m[key], err = json.Marshal(v); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// chatBody is the /v1/chat/completions request for req; resume asks for
// token ids (WithResume).
func chatBody(req api.ChatRequest, resume bool) ([]byte, error) {
	b := paramsBody(req.Model, req.Params, resume)
	b.Messages = make([]message, len(req.Messages))
	for i, m := range req.Messages {
		b.Messages[i] = message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID}
	}
	b.Tools = req.Tools
	b.ChatLogprobs = req.Sampling.Logprobs
	return json.Marshal(b)
}

// setHeaders adds the request's priority and session as the headers
// mlxserving reads (X-Priority, X-Session-ID); other servers ignore them.
func setHeaders(h http.Header, p api.Params, apiKey string) {
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "text/event-stream")
	if apiKey != "" {
		h.Set("Authorization", "Bearer "+apiKey)
	}
	if p.Priority != api.Normal && p.Priority.Valid() {
		h.Set("X-Priority", p.Priority.String())
	}
	if p.Session != "" {
		h.Set("X-Session-ID", p.Session)
	}
}
