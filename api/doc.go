// Package api holds the types a request and its output are made of, shared
// by everything that serves requests: a single mlxserving.Server, request
// merging, and balancer.LoadBalancer over local and remote backends. They
// are data, not behaviour, and live below all of those packages so each can
// produce and consume the same [Stream]. The package imports only the
// standard library: the engine contract, the tokenizer and retry refer to
// its [SamplingParams], [InvalidParamError], [Message] and [Deadlines]
// under their own names (type aliases), so importing api pulls in none of
// their dependencies.
//
//	st, err := srv.Chat(ctx, api.ChatRequest{
//		Model:    "llama",
//		Messages: []api.Message{{Role: "user", Content: "Hello"}},
//		Params:   api.Params{MaxTokens: 64, Priority: api.High},
//	})
//	for c, err := range st.Chunks() { ... c.Text ... }
//
// A producer of tokens implements [Source] and wraps it with [NewStream];
// the caller reads the Stream with Recv, Chunks or Collect and stops it
// with Close.
package api
