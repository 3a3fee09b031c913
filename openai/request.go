package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine/grammar"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

// commonFields are the fields chat and text completions share.
type commonFields struct {
	Model            string             `json:"model"`
	MaxTokens        *int               `json:"max_tokens"`
	Temperature      *float32           `json:"temperature"`
	TopP             *float32           `json:"top_p"`
	Stop             json.RawMessage    `json:"stop"`
	Seed             *int64             `json:"seed"`
	Stream           bool               `json:"stream"`
	StreamOptions    *streamOptions     `json:"stream_options"`
	N                *int               `json:"n"`
	User             string             `json:"user"`
	FrequencyPenalty *float32           `json:"frequency_penalty"`
	PresencePenalty  *float32           `json:"presence_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"`

	// Extensions.
	Priority          string   `json:"priority"`
	SessionID         string   `json:"session_id"`
	TopK              *int     `json:"top_k"`
	MinP              *float32 `json:"min_p"`
	RepetitionPenalty *float32 `json:"repetition_penalty"`
	IgnoreEOS         bool     `json:"ignore_eos"`
	Cache             bool     `json:"cache"`
	// CloseWithinMaxTokens false is api.Params.KeepCut: a structured reply
	// is cut where max_tokens ends instead of closed within it.
	CloseWithinMaxTokens *bool `json:"close_within_max_tokens"`
	// Resume is api.Params.Resume: the token ids an earlier attempt of
	// this request delivered. ReturnTokenIDs (vLLM's return_token_ids)
	// adds each streamed token's id to its chunk, so a balancer can resume.
	Resume         []int32 `json:"resume"`
	ReturnTokenIDs bool    `json:"return_token_ids"`
	// KeepAlive is Ollama's keep_alive: a duration string or seconds.
	KeepAlive json.RawMessage `json:"keep_alive"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
	// IncludeObfuscation is accepted for clients that send it; this
	// server adds no obfuscation padding to chunks.
	IncludeObfuscation *bool `json:"include_obfuscation"`
}

type chatRequest struct {
	commonFields
	Messages            []chatMessage   `json:"messages"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	ResponseFormat      *responseFormat `json:"response_format"`
	// ChatTemplateKwargs is vLLM's chat_template_kwargs: more variables
	// for the chat template, e.g. {"enable_thinking": false}.
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
	// SeparateReasoning is SGLang's separate_reasoning: false returns a
	// reasoning model's <think> block inside content, as generated.
	SeparateReasoning *bool `json:"separate_reasoning"`

	tools bool // replies are parsed for tool calls
}

type chatMessage struct {
	Role       string           `json:"role"`
	Content    json.RawMessage  `json:"content"`
	Name       string           `json:"name"`
	ToolCalls  []map[string]any `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
	// Refusal comes back on assistant messages a client resends as it
	// received them; it carries no prompt text.
	Refusal *string `json:"refusal"`
}

type responseFormat struct {
	Type       string          `json:"type"`
	JSONSchema json.RawMessage `json:"json_schema"`
}

type completionRequest struct {
	commonFields
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	Echo     bool            `json:"echo"`
	Suffix   *string         `json:"suffix"`
	BestOf   *int            `json:"best_of"`
}

// params converts the shared fields into the library's parameters.
// maxTokens is the already-resolved max_tokens field (nil when absent).
func (c *commonFields) params(r *http.Request, maxTokens *int, maxParam string, def int, logprobs bool) (api.Params, error) {
	var p api.Params
	if err := c.unsupported(); err != nil {
		return p, err
	}
	if c.Model == "" {
		return p, badRequest("model", "missing_field", "field \"model\" is required")
	}
	if c.StreamOptions != nil && !c.Stream {
		return p, badRequest("stream_options", "invalid_value", "stream_options is only allowed when stream is true")
	}
	p.MaxTokens = def
	if maxTokens != nil {
		if *maxTokens < 1 {
			return p, badRequest(maxParam, "invalid_value", "%s is %d: it must be at least 1", maxParam, *maxTokens)
		}
		p.MaxTokens = *maxTokens
	}
	p.Sampling.Temperature = 1 // OpenAI's default
	if c.Temperature != nil {
		p.Sampling.Temperature = *c.Temperature
	}
	if c.TopP != nil {
		if *c.TopP <= 0 {
			return p, badRequest("top_p", "invalid_value", "top_p is %v: it must be greater than 0 and at most 1", *c.TopP)
		}
		p.Sampling.TopP = *c.TopP
	}
	if c.Seed != nil {
		p.Sampling.Seed, p.Sampling.HasSeed = uint64(*c.Seed), true
	}
	p.Sampling.Logprobs = logprobs
	setIf(&p.Sampling.TopK, c.TopK)
	setIf(&p.Sampling.MinP, c.MinP)
	setIf(&p.Sampling.RepetitionPenalty, c.RepetitionPenalty)
	setIf(&p.Sampling.PresencePenalty, c.PresencePenalty)
	setIf(&p.Sampling.FrequencyPenalty, c.FrequencyPenalty)
	if len(c.LogitBias) > 0 {
		p.Sampling.LogitBias = make(map[int32]float32, len(c.LogitBias))
		for k, v := range c.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || id < 0 {
				return p, badRequest("logit_bias", "invalid_value", "logit_bias key %q is not a token id", k)
			}
			if v < -100 || v > 100 {
				return p, badRequest("logit_bias", "invalid_value", "logit_bias for token %s is %v: it must be between -100 and 100", k, v)
			}
			p.Sampling.LogitBias[int32(id)] = float32(v)
		}
	}
	if err := p.Sampling.Validate(); err != nil {
		return p, err
	}
	stop, err := parseStop(c.Stop)
	if err != nil {
		return p, err
	}
	p.Stop, p.IgnoreEOS, p.Client = stop, c.IgnoreEOS, c.User
	if p.Priority, err = c.tier(r); err != nil {
		return p, err
	}
	p.Cache = c.Cache
	p.KeepCut = c.CloseWithinMaxTokens != nil && !*c.CloseWithinMaxTokens
	p.Resume = c.Resume
	p.Session = c.SessionID
	// The session headers clients already send: ours, llm-d's and
	// SGLang's router's.
	for _, h := range []string{"X-Session-ID", "X-Session-Token", "X-SMG-Routing-Key"} {
		if p.Session == "" {
			p.Session = r.Header.Get(h)
		}
	}
	// Without an id the request starts a session with a minted one,
	// returned in X-Session-ID for the next turn.
	p.NewSession = p.Session == ""
	if p.KeepAlive, err = parseKeepAlive(c.KeepAlive); err != nil {
		return p, err
	}
	return p, nil
}

func setIf[T any](dst *T, src *T) {
	if src != nil {
		*dst = *src
	}
}

// tier reads the priority from the body, else the X-Priority header.
func (c *commonFields) tier(r *http.Request) (api.Tier, error) {
	name := c.Priority
	if name == "" {
		name = r.Header.Get("X-Priority")
	}
	if name == "" {
		return api.Normal, nil
	}
	t, err := api.ParseTier(name)
	if err != nil {
		return t, badRequest("priority", "invalid_value", "unknown priority %q: want critical, high, normal, low or background", name)
	}
	return t, nil
}

// unsupported refuses shared fields the server cannot honour.
func (c *commonFields) unsupported() error {
	if c.N != nil && (*c.N < 1 || *c.N > maxChoices) {
		return badRequest("n", "invalid_value", "n is %d: it must be between 1 and %d", *c.N, maxChoices)
	}
	return nil
}

// choices is the number of choices asked for.
func (c *commonFields) choices() int {
	if c.N == nil {
		return 1
	}
	return *c.N
}

// chat converts a chat completion request.
func (c *chatRequest) chat(r *http.Request, def int) (api.ChatRequest, error) {
	var req api.ChatRequest
	if err := c.unsupportedChat(); err != nil {
		return req, err
	}
	maxTokens, maxParam := c.MaxTokens, "max_tokens"
	if c.MaxCompletionTokens != nil {
		maxTokens, maxParam = c.MaxCompletionTokens, "max_completion_tokens"
	}
	p, err := c.params(r, maxTokens, maxParam, def, c.Logprobs)
	if err != nil {
		return req, err
	}
	if len(c.Messages) == 0 {
		return req, badRequest("messages", "invalid_value", "messages must hold at least one message")
	}
	if c.TopLogprobs != nil {
		p.Sampling.TopLogprobs = *c.TopLogprobs
	}
	if p.JSONSchema, err = c.ResponseFormat.schema(); err != nil {
		return req, err
	}
	req.Model, req.Params = c.Model, p
	if req.ChatTemplateKwargs, err = templateKwargs(c.ChatTemplateKwargs); err != nil {
		return req, err
	}
	if c.tools, err = c.toolRequest(&req); err != nil {
		return req, err
	}
	req.Messages = make([]api.Message, len(c.Messages))
	for i, m := range c.Messages {
		if req.Messages[i], err = m.message(i); err != nil {
			return req, err
		}
	}
	return req, nil
}

// templateKwargs reads chat_template_kwargs: a JSON object whose keys do
// not replace the variables the template always gets.
func templateKwargs(raw json.RawMessage) (map[string]any, error) {
	if isNull(raw) {
		return nil, nil
	}
	var kw map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if raw[0] != '{' || dec.Decode(&kw) != nil {
		return nil, badRequest("chat_template_kwargs", "invalid_type", "chat_template_kwargs must be a JSON object")
	}
	for k, v := range kw {
		if tokenizer.IsTemplateVariable(k) {
			return nil, badRequest("chat_template_kwargs."+k, "invalid_value", "chat_template_kwargs cannot set %q: the request sets it", k)
		}
		kw[k] = pyNumbers(v)
	}
	return kw, nil
}

// pyNumbers turns JSON numbers into ints where Python's json.loads gives
// an int (no fraction, no exponent), floats otherwise, so a template
// prints 3 as "3", not "3.0".
func pyNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil && !strings.ContainsAny(string(x), ".eE") {
			return int(i)
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i, e := range x {
			x[i] = pyNumbers(e)
		}
	case map[string]any:
		for k, e := range x {
			x[k] = pyNumbers(e)
		}
	}
	return v
}

// separateReasoning reports whether a reasoning model's <think> block
// goes to reasoning_content (the default) rather than content.
func (c *chatRequest) separateReasoning() bool {
	return c.SeparateReasoning == nil || *c.SeparateReasoning
}

func (c *chatRequest) unsupportedChat() error {
	if c.TopLogprobs != nil {
		switch {
		case *c.TopLogprobs < 0 || *c.TopLogprobs > 20:
			return badRequest("top_logprobs", "invalid_value", "top_logprobs is %d: it must be between 0 and 20", *c.TopLogprobs)
		case *c.TopLogprobs > 0 && !c.Logprobs:
			return badRequest("top_logprobs", "invalid_value", "top_logprobs needs logprobs set to true")
		}
	}
	return nil
}

// schema returns the JSON schema response_format asks the output to
// match: nil for text, grammar.AnyObject for json_object.
func (f *responseFormat) schema() ([]byte, error) {
	if f == nil {
		return nil, nil
	}
	switch f.Type {
	case "text", "":
		return nil, nil
	case "json_object":
		return grammar.AnyObject, nil
	case "json_schema":
		var js struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		}
		if isNull(f.JSONSchema) || json.Unmarshal(f.JSONSchema, &js) != nil {
			return nil, badRequest("response_format.json_schema", "invalid_value", "response_format json_schema needs a json_schema object with a name and a schema")
		}
		if js.Name == "" {
			return nil, badRequest("response_format.json_schema.name", "missing_field", "response_format.json_schema.name is required")
		}
		if isNull(js.Schema) {
			return grammar.AnyObject, nil
		}
		if js.Schema[0] != '{' {
			return nil, badRequest("response_format.json_schema.schema", "invalid_type", "response_format.json_schema.schema must be a JSON schema object")
		}
		return js.Schema, nil
	}
	return nil, badRequest("response_format.type", "invalid_value", "response_format type %q: want text, json_object or json_schema", f.Type)
}

// message converts message i, checking its role and content.
func (m *chatMessage) message(i int) (api.Message, error) {
	role := m.Role
	switch role {
	case "system", "user", "assistant", "tool":
	case "developer":
		role = "system"
	case "":
		return api.Message{}, badRequest(fmt.Sprintf("messages.%d.role", i), "missing_field", "message %d has no role", i)
	default:
		return api.Message{}, badRequest(fmt.Sprintf("messages.%d.role", i), "invalid_value",
			"message %d has unknown role %q: want system, developer, user, assistant or tool", i, m.Role)
	}
	param := fmt.Sprintf("messages.%d.content", i)
	if isNull(m.Content) && (role != "assistant" || len(m.ToolCalls) == 0) {
		return api.Message{}, badRequest(param, "missing_field", "message %d (%s) has no content", i, m.Role)
	}
	content, err := parseContent(m.Content, param)
	if err != nil {
		return api.Message{}, err
	}
	var calls []map[string]any
	if len(m.ToolCalls) > 0 {
		calls = templateToolCalls(m.ToolCalls)
	}
	return api.Message{Role: role, Content: content, Name: m.Name, ToolCalls: calls, ToolCallID: m.ToolCallID}, nil
}

// completion converts a text completion request.
func (c *completionRequest) completion(r *http.Request, def int) (api.Request, error) {
	var req api.Request
	switch {
	case c.Logprobs != nil && (*c.Logprobs < 0 || *c.Logprobs > 5):
		return req, badRequest("logprobs", "invalid_value", "logprobs is %d: it must be between 0 and 5", *c.Logprobs)
	case c.Echo:
		return req, badRequest("echo", "unsupported_value", "echo is not supported")
	case c.Suffix != nil && *c.Suffix != "":
		return req, badRequest("suffix", "unsupported_value", "suffix is not supported")
	case c.BestOf != nil && *c.BestOf != 1:
		return req, badRequest("best_of", "unsupported_value", "best_of is %d: only 1 is supported", *c.BestOf)
	}
	p, err := c.params(r, c.MaxTokens, "max_tokens", def, c.Logprobs != nil)
	if err != nil {
		return req, err
	}
	if c.Logprobs != nil {
		p.Sampling.TopLogprobs = *c.Logprobs
	}
	req.Model, req.Params = c.Model, p
	req.Prompt, req.PromptTokens, err = parsePrompt(c.Prompt, true)
	return req, err
}

// parsePrompt reads "prompt": a string, an array of token ids, or a
// one-element array of either (several prompts would be several choices).
// Only the outer array may wrap: a nested array is refused rather than
// unwrapped level by level, which would re-parse the body once per level.
func parsePrompt(raw json.RawMessage, outer bool) (string, []int32, error) {
	if isNull(raw) {
		return "", nil, badRequest("prompt", "missing_field", "field \"prompt\" is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return "", nil, badRequest("prompt", "invalid_value", "prompt is empty")
		}
		return s, nil, nil
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return "", nil, badRequest("prompt", "invalid_value", "prompt is empty")
		}
		return "", ids, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return "", nil, badRequest("prompt", "unsupported_value", "prompt holds %d prompts: only one per request is supported", len(list))
		}
		if outer && (list[0][0] == '[' || list[0][0] == '"') {
			return parsePrompt(list[0], false)
		}
	}
	return "", nil, badRequest("prompt", "invalid_type", "field \"prompt\" must be a string or an array of token ids")
}
