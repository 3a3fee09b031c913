package api

import "time"

// Params are the generation settings shared by Request and ChatRequest.
type Params struct {
	// MaxTokens is the most tokens to generate. Required: at least 1.
	MaxTokens int
	// Sampling chooses how tokens are picked; the zero value is greedy.
	Sampling SamplingParams
	// Stop lists strings that end generation; the text stops before them.
	// Needs the model's tokenizer.
	Stop []string
	// StopTokens lists token ids that end generation, on top of the
	// model's end-of-sequence ids.
	StopTokens []int32
	// IgnoreEOS keeps generating past end-of-sequence tokens.
	IgnoreEOS bool
	// Priority is the request's tier. The zero value is Normal.
	Priority Tier
	// Client identifies the caller for per-client rate limits; "" is not
	// rate limited.
	Client string
	// JSONSchema, when set, constrains the output to one JSON document
	// that matches this JSON schema (the structured-outputs subset
	// engine/grammar compiles; grammar.AnyObject for any JSON object).
	// Generation ends when the document is complete. Needs the model's
	// tokenizer; a schema that cannot be compiled is refused with an
	// *InvalidParamError naming the keyword.
	JSONSchema []byte
	// KeepCut turns off closing constrained output within MaxTokens. By
	// default, once the tokens left (of MaxTokens and of the context) come
	// within reach of what closing the document takes, only tokens that
	// keep it closable are sampled, so that a reply the budget ends is
	// still a complete document that matches the schema: it finishes with
	// FinishLength and Usage.ClosingTokens counts the tokens generated
	// from then on; a schema whose shortest document takes more than
	// MaxTokens is refused with an *InvalidParamError naming max_tokens
	// (its Err a grammar.BudgetError with the minimum). With KeepCut the
	// output is cut where the budget ends, as other servers do.
	KeepCut bool
	// Session keeps a conversation's KV cache: the engine saves the KV of
	// this request under the session id, and the next request of the same
	// session reuses the longest prefix its prompt shares with it,
	// prefilling only what is new. An unknown or expired id starts a new
	// session under that id; an id over 128 bytes or with control
	// characters is refused. "" names no session: the prompt still reuses
	// any saved prefix it shares (automatic prefix caching).
	Session string
	// NewSession asks, when Session is "", for a new session with a
	// minted id, reported in the stream's Header().Session.
	NewSession bool
	// KeepAlive, when set, becomes the model's keep-alive: how long it
	// stays loaded after its last request ends. Zero unloads it as soon
	// as it is idle; negative keeps it loaded. Nil keeps the model's own.
	KeepAlive *time.Duration
	// Deadlines bound the request's time to first token, longest gap
	// between tokens and total time; each zero field takes the Server's
	// default. When one fires the stream ends with a *retry.DeadlineError
	// and the sequence's KV is freed within one engine step.
	Deadlines Deadlines
	// Resume continues a generation an earlier attempt of this request
	// began (on another instance whose stream broke off): the token ids
	// that attempt delivered, in order. The server generates as if the
	// prompt were followed by them — SamplingParams.Generated
	// counts them, and the stop strings, detokenizer and JSONSchema are
	// fed them first — and streams only what follows, so the two streams
	// joined are one generation: exactly the uninterrupted one for greedy
	// requests, and for seeded or presence/frequency-penalised ones on an
	// engine that reports engine.Info.Resumes. MaxTokens and the final
	// usage count the whole generation (Resume included; the prompt once).
	// Tokens that would have ended generation (a stop token or string, a
	// complete JSON document) or as many as MaxTokens are refused with an
	// *InvalidParamError. A resumed request is never merged.
	Resume []int32
	// Adapter runs the request with this LoRA adapter of the model, as
	// naming the adapter as the request's model does (the Server sets it
	// so); the model must then be the adapter's base. Empty: the model as
	// named.
	Adapter string
	// Cache lets a server with a response cache (see the root package's
	// WithMerging) answer this request from a cached identical response
	// and keep this one's for later. Only deterministic requests (greedy,
	// or sampled with a seed) are cached; for others it does nothing.
	Cache bool
}

// Request asks for a completion of a prompt.
type Request struct {
	// Model is the id of a loaded model.
	Model string
	// Prompt is the text to complete, tokenized with the model's
	// tokenizer (with its BOS). Ignored when PromptTokens is set.
	Prompt string
	// PromptTokens is the prompt as token ids.
	PromptTokens []int32
	Params
}

// Message is one chat message as chat templates see it. Empty optional
// fields are left out of the template's message object, as a Python caller
// that omits the key would.
type Message struct {
	Role    string
	Content string
	// Name is the optional participant name.
	Name string
	// ToolCalls are an assistant's tool calls, OpenAI-shaped
	// ({"id", "type": "function", "function": {"name", "arguments"}}).
	ToolCalls []map[string]any
	// ToolCallID links a "tool" message to the call it answers.
	ToolCallID string
}

// ChatRequest asks for the next assistant message of a conversation,
// rendered with the model's chat template.
type ChatRequest struct {
	// Model is the id of a loaded model.
	Model string
	// Messages is the conversation so far. Must not be empty.
	Messages []Message
	// Tools are tool definitions passed to the chat template, for models
	// whose template supports them.
	Tools []map[string]any
	// ForceTool, when set, makes the reply a tool call: the server opens
	// the model family's tool-call syntax after the generation prompt and
	// constrains decoding to a call of the named function, or of any of
	// ForceTools when the name is "*". The stream's Header.ToolFormat
	// names the syntax; the generated text is the call's JSON.
	ForceTool string
	// ForceTools are the functions a forced call may name, with their
	// parameter schemas (toolcall.Tool).
	ForceTools []ToolSpec
	// ChatTemplateKwargs are further variables for the chat template
	// (vLLM's chat_template_kwargs), such as {"enable_thinking": false}
	// for Qwen3. Keys that name a variable the template always gets
	// (messages, tools, bos_token, ...) override it; the HTTP layer
	// refuses them. Nil adds none.
	ChatTemplateKwargs map[string]any
	Params
}

// ToolSpec is a function a forced tool call may name.
type ToolSpec struct {
	Name string
	// Parameters is the arguments' JSON schema; nil takes any object.
	Parameters []byte
}
