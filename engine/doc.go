// Package engine is the contract between the serving layer and the code that
// runs a model.
//
// An engine is a step-level executor. It loads a checkpoint into a [Model];
// the batcher then drives the model one forward pass at a time: every [Model.Step]
// carries a batch of sequences, each feeding either a prompt chunk or its
// last sampled token, and returns the next token of every sequence that asked
// to sample. Sampling happens inside the engine, next to the logits; only
// token ids cross this boundary. Batching policy, chunked prefill,
// cancellation and stop conditions live in the batcher, once, for every
// engine.
//
// The engine owns KV memory: [Model.Open] reserves a sequence (reusing KV
// saved under a prefix key when its tokens start the prompt),
// [Model.Free] releases it (optionally saving its KV for reuse), and
// [Info.KVCapacity] tells the batcher how many tokens it may admit.
//
// Use:
//
//	m, err := eng.Load(ctx, engine.ModelSpec{ID: "tiny", Path: dir})
//	reused, err := m.Open(ctx, 1, prompt, "")
//	out, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: prompt[reused:], Sample: true, Params: &engine.SamplingParams{}}})
//	m.Free(1, "")
//
// A model may also implement [Warmer]: Warm runs one step at each
// batch-size bucket the engine uses on scratch memory, so compiled kernels
// and CUDA graphs exist before the first request; a model serving LoRA
// adapters ([AdapterModel]) may implement [AdapterWarmer], which makes an
// adapter resident wherever the model runs sequences. [Info] reports the
// model's weight and KV memory, which a memory budget adds up. An engine
// that runs its models on several workers may report their circuit
// breakers ([WorkerBreakers]) and which worker holds a saved prefix
// ([WorkerLocator]).
//
// Resuming: a sequence whose worker was lost after it generated n tokens
// can go on as a new sequence whose prompt is the old prompt plus those
// n tokens. Greedy and unseeded sampling continue correctly on any
// engine. A model that sets [Info.Resumes] also follows the Generated
// field of [SamplingParams] (set to n on the new sequence): its seeded
// draws are a function of the seed and the generated position and its
// presence and frequency penalties count those n tokens, so a seeded or
// penalised sequence continues exactly as the uninterrupted one would
// have. The conformance suite (engine/enginetest) checks it.
//
// Errors are the sentinels and typed errors of this package, so callers
// branch with errors.Is and errors.As whichever engine produced them.
package engine
