// Package httpbackend is a [balancer.Backend] over a remote
// OpenAI-compatible server: another mlxserving instance, or any upstream
// speaking that API (vLLM, llama.cpp's server, Ollama, mlx_lm.server).
//
//	b, err := httpbackend.New("http://10.0.0.7:8000", httpbackend.WithAPIKey(key))
//	if err != nil { ... }
//	defer b.Close()
//	lb.Add("gpu-7", b) // a balancer.LoadBalancer routes to it
//
// Generate posts to /v1/completions and Chat to /v1/chat/completions,
// always streaming (stream: true with stream_options.include_usage), and
// turns the server-sent events into the same [api.Stream] a local Server
// returns: text, finish reason, and usage with cached prompt tokens. The
// request's priority and session travel in the X-Priority and X-Session-ID
// headers, which mlxserving reads and other servers ignore. An upstream
// that ignores stream:true and answers one JSON completion is read as one
// chunk of text and the final chunk.
//
// Embed posts to /v1/embeddings with encoding_format "base64" (the
// vectors exact, as little-endian float32) and reads vectors in either
// encoding, items in any order by their index. Texts go as an array of
// strings and token ids as an array of arrays; a request mixing the two,
// which one OpenAI body cannot carry, goes as two requests whose vectors
// are put back in input order. The priority travels in X-Priority, and
// mlxserving's "truncate" and "cache" only when set.
//
// Failures are typed. A request the upstream did not take (connection
// refused or reset, no response headers in time, an HTTP error status)
// returns an [*Error] before any chunk: nothing was streamed, and
// [Error.Retryable] says whether another backend may be tried (429, 408,
// 5xx and transport failures are; other 4xx are not); RetryAfter carries
// the upstream's Retry-After. A stream that breaks after text reached the
// caller ends with a *retry.InterruptedError, never with a silent
// truncation; one that breaks before any text ends with an *Error, still
// safe to retry. An error event inside the stream is a [*StreamError]
// under either; like an *Error it unwraps to the typed error the
// upstream's code stands for (internal/wireerr rebuilds both, as it does
// for balancer/natsbackend), so a deadline that fired upstream is a
// *retry.DeadlineError here.
//
// An mlxserving upstream added WithResume streams every token's id
// (return_token_ids), so a balancer.LoadBalancer resumes a stream it
// breaks off on another backend, and receives a resumed request's
// delivered ids as "resume" (api.Params.Resume). A foreign upstream's ids
// are unknown: its broken stream ends with the InterruptedError, and it
// refuses a request carrying Resume with ErrNoResume (the balancer tries
// another backend).
//
// Load returns what a background poller last read from the upstream's
// /v1/models and /metrics: the models it serves, and its queue, running
// sequences and KV use from vLLM-named gauges (vllm:num_requests_waiting,
// vllm:num_requests_running, vllm:kv_cache_usage_perc) or mlxserving's own
// (mlxserving_sequences_waiting, mlxserving_sequences_running,
// mlxserving_kv_usage). Close stops the poller.
package httpbackend
