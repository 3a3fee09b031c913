// Package openai serves an [mlxserving.Server] over the OpenAI HTTP API, so
// the official OpenAI clients (and anything built on them) work against a
// Go program that embeds its own models. It serves a
// balancer.LoadBalancer in front of several instances the same way: New
// takes any balancer.Backend.
//
//	srv, _ := mlxserving.New(eng)
//	_ = srv.LoadModel(ctx, engine.ModelSpec{ID: "llama", Path: dir})
//	h, _ := openai.New(srv, openai.WithLogger(logger), openai.WithMetricsHandler(promHandler))
//	hs := &http.Server{Addr: "127.0.0.1:8080", Handler: h}
//	_ = hs.ListenAndServe()
//
// # Endpoints
//
//	POST /v1/chat/completions   chat, streaming (SSE) or not
//	POST /v1/completions        text completion, streaming (SSE) or not
//	POST /v1/embeddings         vectors of texts or token ids (models that embed)
//	GET  /v1/models             the known models (loaded or not); GET /v1/models/{id} one of them
//	GET  /health                liveness: 200 while the process serves HTTP
//	GET  /ready                 readiness: 200 once models are loaded (and warm,
//	                            see WithReadyCheck), 503 otherwise
//	GET  /metrics               the handler given to WithMetricsHandler (404 without)
//	POST /debug/trace           the handler given to WithTraceHandler (404 without): a
//	                            device trace of the engine's next steps, as vLLM's /start_profile
//
// # Request fields
//
// Supported as OpenAI documents them: model, messages (string content or
// an array of text parts), prompt (a string, one token-id array, or a
// one-element array of either), max_tokens, max_completion_tokens,
// temperature (default 1, as OpenAI), top_p, stop (string or list), seed,
// stream, stream_options.include_usage (include_obfuscation is accepted;
// no obfuscation padding is added), logprobs and top_logprobs (chat: up to
// 20; completions: logprobs up to 5), logit_bias, presence_penalty and
// frequency_penalty (counted over the generated tokens), user (used as
// the client key for per-client rate limits). When max_tokens is absent the
// request generates up to the default (WithDefaultMaxTokens), or up to what
// is left of the model's context if that is less.
//
// /v1/embeddings takes input (a string, an array of strings, an array of
// token ids or an array of such arrays; up to 2048 inputs, none empty),
// encoding_format (float, the default, or base64: each vector's
// little-endian float32 bytes), dimensions (models whose config.json
// says they are Matryoshka: the first dimensions, normalized again when
// the model normalizes) and user, and the extensions priority, cache and
// truncate (cut inputs over the model's limit to fit, keeping the final
// special token, instead of a 400 context_length_exceeded). Vectors are
// pooled and normalized as the checkpoint's sentence-transformers files
// say; usage counts the input tokens.
//
// n (up to 8) runs one generation per choice; a seeded request gives
// choice i the seed plus i. Usage counts the prompt once and the tokens of
// every choice.
//
// Structured output: response_format json_object (any JSON object) and
// json_schema (the structured-outputs subset of JSON schema, see
// engine/grammar) constrain decoding token by token, so the reply is valid
// JSON that matches; it ends with finish_reason "stop" when the document
// is complete. A schema keyword the grammar cannot enforce is a 400 naming
// it. A structured reply is closed within max_tokens (and the context
// left): once the tokens left come within reach of what closing the
// document takes, only tokens that keep it closable are sampled, so a
// reply that runs out of tokens is still a complete document that
// validates, shortened; it ends with finish_reason "length", and
// usage.completion_tokens_details.closing_tokens (an extension) counts the
// tokens generated from the first budget-restricted token on. A schema
// whose shortest document takes more than max_tokens is a 400 on
// max_tokens naming the minimum. The extension "close_within_max_tokens":
// false turns this off: the reply is cut where max_tokens ends, a valid
// prefix with finish_reason "length", as OpenAI's API and vLLM return it.
//
// Tools: tools (function tools) are rendered through the model's chat
// template; tool_choice "auto" (the default with tools) parses the reply
// for the model family's tool calls (Hermes/Qwen <tool_call> blocks,
// Llama 3.1 JSON, Mistral [TOOL_CALLS]); "required" or a named function
// opens the family's call syntax and constrains decoding to a valid call
// of the allowed function(s), so even a small model produces one; "none"
// leaves the tools out. Calls come back as message.tool_calls with
// finish_reason "tool_calls", and streamed as deltas with index, id, type
// and name, then the arguments. Assistant messages with tool_calls and
// role "tool" messages are accepted back. Malformed tools are a 400.
//
// Anything the server cannot honour is refused with a 400 naming the field,
// never silently ignored: n above 8, echo, suffix, best_of above 1,
// and any field the server does not know. Bodies must be valid UTF-8 JSON
// no larger than WithMaxBodyBytes (413 otherwise).
//
// # Extensions
//
// Priority: the body field "priority" or the header X-Priority names the
// request's tier ("critical", "high", "normal", "low", "background"; the
// body wins when both are given; default normal). An unknown tier is a 400.
//
// Session: the body field "session_id" or the header X-Session-ID keeps a
// conversation's KV cache between requests, so a later turn only prefills
// what its prompt does not share with the previous one. A request without
// an id starts a session under a minted one; the response's X-Session-ID
// header names the session either way. An unknown or expired id starts
// afresh; an id over 128 bytes or with control characters is a 400.
// Prompts that share a prefix with KV saved by any earlier request (a
// common system prompt) reuse it with or without a session. Usage reports
// the reused tokens in usage.prompt_tokens_details.cached_tokens, in the
// final streamed chunk too with stream_options.include_usage.
//
// Sampling beyond OpenAI's fields, as vLLM names them: top_k, min_p,
// repetition_penalty and ignore_eos.
//
// Resuming a stream across servers: "return_token_ids": true (vLLM's
// name) adds each token's id to its streamed chunk as "token_ids": [id]
// (one chunk per token, also where the token's text is held back), and
// "resume": [ids] continues a generation whose first tokens an earlier
// attempt delivered (api.Params.Resume): the reply streams only what
// follows them, and its usage counts the whole generation. A load
// balancer (httpbackend.WithResume) uses both.
//
// Reasoning, as vLLM and SGLang return it: for a model whose chat
// template writes <think>, a chat reply's reasoning block is
// message.reasoning_content (delta.reasoning_content when streamed) and
// tool calls are parsed from the rest; "separate_reasoning": false
// (SGLang's name) keeps the block in content. "chat_template_kwargs"
// (vLLM's name) passes an object's keys to the chat template, e.g.
// {"enable_thinking": false}; a non-object, or a key the request itself
// sets (messages, tools, bos_token, ...), is a 400 naming it.
//
// Keep-alive, as Ollama names it: "keep_alive" is how long the model stays
// loaded after this request — a duration ("5m") or seconds (300); 0
// unloads it once idle, negative keeps it loaded. A request for a model
// the server knows but has not loaded waits while it loads. /v1/models
// lists every known model with extra fields OpenAI clients ignore: state
// (unloaded, loading, loaded, unloading, failed), pinned, memory_bytes,
// idle_until (Unix seconds), and error and retry_at after a failed load.
//
// Request merging (when the Server has it on, mlxserving.WithMerging):
// identical deterministic requests (temperature 0, or a seed) in flight
// together share one generation, and the body field "cache": true lets a
// server with a response cache answer from it. The response header
// X-Cache says what happened: "miss" (a fresh generation), "merged"
// (joined an identical one in flight) or "hit" (replayed from the cache,
// its usage counting every prompt token as cached); it is absent for
// requests that are not eligible.
//
// Resumed streams: a stream whose engine worker (or, through a load
// balancer, whose backend) was lost after tokens reached the client goes
// on where it stopped (see the batcher), with nothing repeated or lost.
// Which backend finished a stream, and what resuming cost it, is told at
// its end, not in a header (the headers leave before the stream could
// move): a streamed reply that resumed, or that a load balancer routed,
// ends with the SSE comment
//
//	: finished backend=NAME resumes=N resume_gap_ms=MS
//
// before data: [DONE] (backend left out when no balancer named one,
// resumes and resume_gap_ms when it did not resume; the official clients
// skip comments), and the handler logs "request resumed" at Info with the
// request's id, resumes, resume_gap and backend.
//
// # API keys
//
// WithAPIKeys (keys from LoadKeyFile or ParseKeyList) makes every route
// but /health and /ready need "Authorization: Bearer <key>", as OpenAI's
// clients send it. Keys are kept as SHA-256 hashes and compared in
// constant time. Each key has a name — the scheduler's client id for its
// rate limits and metrics, in place of the body's "user", and what logs
// show; never the key — the most urgent tier it may ask for, the models it
// may use, and request and token limits per minute. /metrics,
// /debug/trace (and any operator route) and the keep_alive field need a
// key marked Admin. A
// missing or wrong key is a 401, a model or tier the key may not use a
// 403 (a request that names no tier runs at normal, or at the key's
// highest tier if that is lower), a key over its limits a 429 with
// Retry-After; /v1/models lists only the key's models.
//
// # Errors
//
// Errors have OpenAI's shape, {"error":{"message","type","param","code"}},
// mapped from the library's typed errors by retry.Classify, the table the
// load balancer, the breakers and the metrics use too: invalid JSON, wrong
// types and out-of-range values 400; unknown model 404 (also from a load
// balancer none of whose backends has it); a prompt longer than the context
// 400 with the numbers (the extension field "context": prompt_tokens,
// max_tokens, context_length, which lets a gateway in front fit a request
// without max_tokens as this server would); a body over the limit 413; a
// full queue or a client's rate limit 429 with Retry-After; an overloaded
// server, memory pressure or a closing server (requests cut off by shutdown
// included) 503; a model that cannot be loaded now (its load failed and
// backs off, or the memory budget is held by pinned or busy models) 503; no
// backend of a load balancer able to take the request 503; an engine
// failure 500; a refused or reset connection to an upstream 503
// worker_unavailable. Every 503 carries Retry-After (1 s unless the refusal says
// when). The same request answers the same status, code and Retry-After
// through a load balancer that reaches this server over HTTP
// (httpbackend) or NATS (natsbackend) as from the server itself. An error after a stream started (a
// deadline, a lost backend, shutdown) is sent as an SSE event
// data: {"error":{...}} with the same message, type, param and code as the
// status table above, followed by data: [DONE]: the npm openai client
// throws it as an APIError whose code names it (its status is undefined
// after a 200), openai-go ends the stream with a *ssestream.StreamError.
// The text streamed before it stands. A request that is not streamed and
// fails after tokens gets the error status and no text.
//
// A client that disconnects cancels its generation: the request's context
// ends, and the sequence and its KV memory are freed within one engine step.
package openai
