// Package mlxserving lets a Go program serve large language models itself.
//
// A [Server] composes an engine (the cgo engine on MLX in engine/mlx, the
// Python-subprocess engine in engine/pyproc, or the simulated engine in
// engine/enginetest for testing), a priority scheduler per model
// (scheduler.PriorityScheduler: SLA tiers, shortest-job-first, aging,
// bounded queue, rate limits, preemption) and a continuous batcher per model
// (batcher.ContinuousBatcher: iteration-level batching with chunked
// prefill). Requests are validated before they are queued; output streams
// token by token.
//
//	eng, _ := pyproc.New(ctx)                // or mlx.New(), enginetest.NewSim()
//	srv, _ := mlxserving.New(eng)
//	_ = srv.LoadModel(ctx, engine.ModelSpec{ID: "llama", Path: "/models/Llama-3.2-1B-Instruct"})
//	st, _ := srv.Chat(ctx, api.ChatRequest{Model: "llama",
//		Messages: []api.Message{{Role: "user", Content: "Hello"}},
//		Params:   api.Params{MaxTokens: 64}})
//	for c, err := range st.Chunks() { ... c.Text ... }
//
// A model that embeds (an encoder such as BERT, or a decoder embedding
// model such as Qwen3-Embedding) answers [Server.Embed]: its inputs run as
// prefill-only sequences in the same batches as generation, pooled and
// normalized as the checkpoint's sentence-transformers files say.
//
//	res, _ := srv.Embed(ctx, api.EmbedRequest{Model: "bge",
//		Inputs: []api.EmbedInput{{Text: "what is paging?"}}})
//	// res.Vectors[0]
//
// A model manager (package prewarm) sits behind the models: LoadModel
// loads and pins a model; [Server.RegisterModel] makes one known and loads
// it on its first request (concurrent requests share one load), unloading
// it after its keep-alive or to stay under [WithMemoryBudget]; a
// prewarm.PreWarmer loads and warms models by priority before traffic
// through [Server.Preload] and [Server.WarmModel].
//
// Errors are typed: engine.InvalidParamError for bad input,
// engine.ContextLengthError when a request can never fit,
// scheduler.QueueFullError (with RetryAfter) when the queue is full,
// [ModelNotFoundError] for an unknown model, prewarm.LoadError and
// prewarm.BudgetError (with RetryAfterHint) when a model cannot be loaded now,
// retry.DeadlineError when a request's deadline (first token, stall,
// total; [WithDeadlines]) fired, retry.InterruptedError when its engine
// worker died after tokens had reached the caller and the stream could not
// resume exactly (seeded sampling or presence or frequency penalties on an
// engine that does not report engine.Info.Resumes; other streams resume on
// a live worker). Branch on them with errors.Is and
// errors.As.
//
// With [WithMerging], identical deterministic requests in flight at once
// share one generation and, opted in, are answered from a response cache
// (package merge).
package mlxserving
