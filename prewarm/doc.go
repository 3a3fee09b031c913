// Package prewarm gets models ready before traffic and keeps several of
// them under a memory budget.
//
// A [PreWarmer] loads and warms a list of models into a [Target] (an
// mlxserving.Server) at start-up: by priority, one at a time or several at
// once ([WithConcurrency]), each within a timeout ([WithModelTimeout]),
// a failing model not stopping the others. Warming runs the engine's own
// warm-up — one step at each batch-size bucket, so compiled kernels and
// CUDA graphs exist before the first request (engine.Warmer) — then a
// short real generation per warm-up prompt. [PreWarmer.Status] reports
// each model's phase (pending, loading, warming, ready, failed, aborted)
// and timings; [PreWarmer.Ready] waits for the readiness policy:
// [WhenComplete], or [WhileWarming] once the models at or above a
// priority are ready. Stop (or cancelling Start's context) aborts what is
// still loading or warming and leaves nothing of it loaded.
//
//	pw, err := prewarm.New(srv, []prewarm.Model{
//		{Spec: engine.ModelSpec{ID: "chat", Path: "/models/llama"}, Priority: 10, Prompts: []string{"Hello"}},
//		{Spec: engine.ModelSpec{ID: "code", Path: "/models/qwen"}, Priority: 1},
//	}, prewarm.WithConcurrency(2), prewarm.WithReadiness(prewarm.WhileWarming(10)))
//	err = pw.Start(ctx)
//	defer pw.Stop()
//	err = pw.Ready(ctx) // "chat" serves; "code" may still be warming
//
// A [Manager] is the policy behind a server that knows more models than
// fit: a registry of models loaded on demand (concurrent requests for an
// unloaded model share one load, and a failed load fails them all with
// the same *[LoadError]), a memory budget in bytes kept by evicting the
// least recently used idle models (never pinned ones, never ones with
// requests queued or running; a *[BudgetError] when nothing can go),
// keep-alive unloading of idle models (as in Ollama: a default of five
// minutes, per model and per request, zero unloads when idle, negative
// never), and back-off after a failed load (10 s doubling to 5 min, as in
// LocalAI). It drives a [Host], the serving layer, through a small
// interface; mlxserving.Server creates its own Manager.
package prewarm
