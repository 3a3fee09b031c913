// Package batcher runs a model's sequences with continuous (iteration-level)
// batching.
//
// A [ContinuousBatcher] owns one loaded model. Its single goroutine takes
// waiting sequences from a [Queue] (the priority scheduler) whenever they fit
// — free batch slots, the per-step token budget, the engine's KV capacity —
// and runs the model one step at a time. Every step carries one token for
// each decoding sequence plus prompt chunks under the remaining token budget,
// so long prompts never stall the sequences already generating. Sequences
// leave the batch at any step: when they hit their token limit, an
// end-of-sequence or stop token, a stop string found by their [Detokenizer],
// or when they are cancelled, and their KV is freed before the next step.
// A constrained sequence (Sequence.Constraint) whose grammar forces its
// next tokens — a key name, a closing brace, the rest of an enum value —
// gets them appended without a forward pass each and fed with its next
// decode (jump-forward decoding, [WithJumpForward]). One whose grammar
// loops (a [Looper]: inside a free string) passes the loop to the engine
// (engine.StepInput.Loop), which may decode ahead under the same mask,
// and keeps its mask after a token in the loop instead of computing it
// again.
//
// The engine waits for the batcher's bookkeeping only: a step's text
// work — detokenizing each sampled token and handing its chunk to the
// reader — runs in a goroutine of its own while the engine runs the next
// step, for every sequence whose next step does not depend on it (no
// constraint, no stop strings, not finishing with the token, not its
// first;
// [WithTextBehindStep]).
//
// On a model that takes steps ahead (engine.Pipeliner, the Python
// engine's workers), the batcher sends step N+1 before it reads step N's
// tokens ([WithPipeline]): a sequence that samples in step N feeds that
// token in N+1 without the batcher knowing it (the engine resolves it), so
// delivering N's tokens, admission, planning N+1 and the trip to the
// engine all run while the device runs N. Steps whose inputs need the
// previous tokens (constrained sequences, preemptions, adapter and
// embedding admissions) wait for the pending step first.
//
// A sample that ends its sequence by length (its MaxTokens, or the
// model's context) is marked engine.StepInput.Last, so an engine that
// computes steps ahead (the Python engine's speculated decode step, its
// lookahead) does none for it.
//
// A lower-tier sequence may be preempted for a blocked critical one (when
// the queue allows it): it is requeued and later recomputes its prompt plus
// the tokens it already produced, so its stream continues without
// repeating a token. A sequence whose engine worker died is retried under a
// [retry.Policy] (see [WithRetryPolicy]): from its prompt before its first
// token, and after tokens by resuming the same way as after a preemption,
// so the caller's stream shows no gap, no repeat and no error: the
// recomputed sequence carries engine.SamplingParams.Generated, so on a
// model that reports engine.Info.Resumes seeded draws and presence and
// frequency penalties continue where they stopped. On other models,
// sequences that cannot resume exactly (seeded sampling, presence or
// frequency penalties) fail with a *retry.InterruptedError instead.
//
// KV: a model that does not page has each sequence reserve its whole
// possible length (prompt plus max tokens) at admission. A paged model
// (engine.Info.Paged, engine.BlockPool) is admitted by blocks: a sequence
// enters while the blocks for its prompt are free, takes blocks as it
// grows, and when a step would need more than the pool has, prompt chunks
// wait and the lowest-tier, most recently admitted sequences are
// preempted and later recomputed — an admitted request never fails for
// want of KV. On an engine whose pool is split across workers a step can
// run in part (engine.PartialStepError: one worker short of blocks while
// the others had room): the tokens of the inputs that ran are delivered
// and the others step again, after one of their sequences is preempted.
// After a refusal (in part or whole) nothing is admitted until a step
// runs whole, so the refused sequences step before the victim, or a
// newcomer routed to the same worker, can join them again.
// Stats reports the pool, the preemptions and the steps run in part.
//
// Use:
//
//	q, _ := scheduler.New[*batcher.Sequence]()
//	b, _ := batcher.New(model, q, batcher.WithTokenBudget(4096))
//	defer b.Close()
//	seq := &batcher.Sequence{Prompt: ids, MaxTokens: 64}
//	_ = q.Push(&batcher.Entry{Value: seq, Tier: api.Normal, Cost: len(ids) + 64})
//	for c, err := seq.Recv(ctx); err == nil; c, err = seq.Recv(ctx) { ... }
package batcher
