package engine

import (
	"context"
	"math"
)

// Engine loads checkpoints into models. An Engine may hold several models
// at once; each is independent.
//
// Methods are safe for concurrent use.
type Engine interface {
	// Name identifies the engine implementation ("pyproc", "mlx", "sim").
	Name() string

	// Load reads the Hugging Face-layout checkpoint directory spec.Path
	// (config.json, *.safetensors, tokenizer.json, tokenizer_config.json)
	// and returns a model ready to Step. It honours ctx while loading; a
	// cancelled load returns ctx.Err() and leaves nothing allocated.
	//
	// Errors: a *CheckpointError (wrapping ErrBadCheckpoint) for missing,
	// corrupt or unsupported checkpoints, ErrOutOfMemory when the weights
	// do not fit, ErrUnavailable when the engine cannot run here, ErrClosed
	// after Close.
	Load(ctx context.Context, spec ModelSpec) (Model, error)

	// Close unloads every model the engine loaded and releases the
	// engine's resources (processes, threads, device memory). It returns
	// when they are gone. Calls on the engine or its models after Close
	// return ErrClosed. Close is idempotent.
	Close() error
}

// ModelSpec says what to load and how to size it.
type ModelSpec struct {
	// ID is the name requests use for this model. Required.
	ID string
	// Path is the checkpoint directory. Required.
	Path string
	// MaxBatch caps the sequences one Step may carry. Zero lets the engine
	// choose its default.
	MaxBatch int
	// KVCapacity caps the KV cache, in tokens across all sequences. Zero
	// lets the engine size it from available memory.
	KVCapacity int
	// ContextLength overrides the model's context window downwards. Zero
	// keeps the checkpoint's value.
	ContextLength int
	// AdapterSlots is how many LoRA adapters a model that serves them
	// (AdapterModel) keeps resident on the device at once; zero:
	// DefaultAdapterSlots.
	AdapterSlots int
	// MaxAdapterRank is the highest adapter rank accepted; zero:
	// DefaultMaxAdapterRank.
	MaxAdapterRank int
}

// Model is a loaded model: a step-level executor with its own KV memory.
//
// Info is safe for concurrent use. Open, Step and Free are not: the caller
// (the batcher's loop) serialises them. Engines rely on that and keep no
// locks on the hot path.
//
// A sequence's life: Open allocates it (and may attach a cached prefix),
// Step feeds it tokens and samples, Free releases it. Every opened
// sequence must be freed, also after errors; Free of an unknown or already
// freed sequence is a no-op.
type Model interface {
	// Info describes the model. It does not change after Load.
	Info() Info

	// Open starts sequence id for the given full prompt. If prefixKey is
	// non-empty and the engine holds KV saved under that key, the engine
	// attaches the KV of the longest common prefix of the saved tokens and
	// prompt (the saved KV truncated to where the two first differ; the
	// saved entry itself stays intact for later Opens) and returns its
	// length; the caller then feeds only prompt[reused:]. A saved entry
	// that shares no first token with prompt, or an unknown key, reuses 0.
	// Reuse is never the whole prompt: at least one token is left to feed,
	// so the first Step has logits to sample from. Tokens generated from a
	// reused prefix equal those of a full prefill.
	//
	// Errors: *ContextLengthError when the prompt does not fit the context,
	// ErrOutOfMemory when the KV cannot be reserved now (retry after other
	// sequences finish), ErrWorkerLost, ErrClosed.
	Open(ctx context.Context, id SeqID, prompt []int32, prefixKey string) (reused int, err error)

	// Step runs one forward pass over the batch. Each input appends its
	// Tokens to its sequence's KV; inputs with Sample set get back the next
	// token sampled with their own parameters. The outputs hold exactly
	// one entry per sampling input, in input order. A sequence appears at
	// most once per batch; the batch holds at most Info().MaxBatch inputs.
	//
	// A batch gives every sequence the same tokens it would get alone.
	//
	// If ctx ends during Step, Step returns ctx.Err() and the KV of the
	// batch's sequences is undefined: the caller frees them. On any error
	// the caller must treat every sequence in the batch as failed; errors
	// that wrap ErrWorkerLost are retryable from the start. Two errors
	// say more: ErrOutOfMemory changed no sequence (BlockPool), and a
	// *PartialStepError, from an engine that splits a batch across
	// workers, says which inputs ran (changed as by a successful Step,
	// their outputs in it) while the others changed nothing — one
	// worker's pool was short of blocks while others had room.
	Step(ctx context.Context, batch []StepInput) ([]StepOutput, error)

	// Free releases sequence id. If saveKey is non-empty the engine may keep
	// the sequence's KV (every token it was fed) under saveKey, replacing
	// what was saved under that key, so a later Open with that key reuses
	// its longest common prefix; saved KV is evicted (least recently used
	// first) as memory is needed, never blocks admission and never counts
	// against KVCapacity. Free never fails for a live model; after Close it
	// is a no-op.
	Free(id SeqID, saveKey string)

	// Close unloads the model and frees its memory, returning when that is
	// done. Calls after Close return ErrClosed. Close is idempotent.
	Close() error
}

// SavedKV is implemented by models that keep KV saved by Free and let the
// caller keep an index of it (package session does): which keys the engine
// dropped on its own, and a way to drop a key the caller no longer wants.
// Its methods are serialised with Open, Step and Free like them.
type SavedKV interface {
	// DropSaved discards the KV saved under key. An unknown key is a no-op.
	DropSaved(key string)
	// EvictedSaved returns the keys whose saved KV the engine discarded
	// on its own since the previous call — evicted for memory or by the
	// engine's bound on saved entries, or lost with a worker — and
	// forgets them. Keys replaced by a Free with the same key, or dropped
	// by DropSaved, are not reported.
	EvictedSaved() []string
}

// Pipeliner is implemented by models that take a step before the
// previous step's tokens are read, so the caller's work between steps —
// delivering tokens, admitting, planning the next batch — and the trip
// to the device run while the device runs the previous step (vLLM's
// async scheduling, SGLang's overlap scheduler). At most one step is
// pending when StepAsync is called: the caller sends step N+1, then
// waits for step N.
//
// Its methods are serialised with Open, Step and Free like them. While a
// step is pending the caller may send one more step (StepAsync), open
// (OpenAsync), call Free and FreeBlocks, and use SavedKV's methods (the
// prefix cache does, at its opens and frees); Step, Open and every other
// method may be called only when no step is pending. Of those allowed:
//   - Free of a sequence in a pending step is allowed; it takes effect
//     after that step (and the step still returns the sequence's output,
//     which the caller ignores). The KV saved under the key then holds
//     the token that step fed.
//   - FreeBlocks does not wait for a pending step: it reports the pool as
//     the engine knows it now, which may not yet count the blocks a
//     pending step takes (the caller subtracts those) nor those freed
//     behind it.
//
// A lost worker fails every pending step and open with ErrWorkerLost.
type Pipeliner interface {
	// StepAsync checks batch and sends it behind the pending step, if
	// any, returning without waiting for the device. Inputs may use Prev.
	// ok false: the model runs this batch better synchronously (say, a
	// small batch it decodes ahead on its own); nothing was sent, and the
	// caller waits for the pending step and uses Step. An error means
	// nothing was sent either: an invalid batch, or a lost worker. The
	// caller leaves batch as it is until the step's Wait returns (a
	// wrapper such as the prefix cache reads it then).
	StepAsync(ctx context.Context, batch []StepInput) (p PendingStep, ok bool, err error)
	// OpenAsync is Open without waiting for the reply. Before its
	// PendingOpen's Wait returned nil the sequence may be stepped only by
	// one StepAsync input marked Opening (its first prompt chunk, sent
	// behind the open); Free before that is allowed and takes effect
	// after the open. ok false: the caller uses Open, after waiting for
	// the pending step.
	OpenAsync(ctx context.Context, id SeqID, prompt []int32, prefixKey string) (p PendingOpen, ok bool)
}

// PendingStep is a step sent by Pipeliner.StepAsync.
type PendingStep interface {
	// Wait returns what Step would have returned for the batch, with
	// Step's error contract. A step sent behind a step that failed fails
	// with an error wrapping ErrNotRun, having changed no sequence. Wait
	// may be called once.
	//
	// On an engine that splits a batch across workers, only the inputs
	// on the workers where the step before failed are not run; the
	// others run, and Wait returns a *PartialStepError whose Err wraps
	// ErrNotRun, or the outputs when no input was on such a worker. So
	// an input is never run after its sequence's input in the step
	// before was left unchanged (ErrOutOfMemory, ErrNotRun, or not run
	// in a *PartialStepError); but a step that failed otherwise (a lost
	// worker) may have run on some workers, and so may the step behind
	// it: the caller fails the sequences of both, unless the one behind
	// changed nothing.
	Wait(ctx context.Context) ([]StepOutput, error)
}

// PendingOpen is an open sent by Pipeliner.OpenAsync.
type PendingOpen interface {
	// Wait returns what Open would have returned. Wait may be called once.
	Wait(ctx context.Context) (reused int, err error)
}

// SeqID names a sequence within one model. The caller picks ids and never
// reuses one while it is open.
type SeqID uint64

// StepInput is one sequence's share of a Step.
type StepInput struct {
	Seq SeqID
	// Tokens to append: a prompt chunk, or the token sampled last step.
	// Never empty.
	Tokens []int32
	// Sample asks for the next token after Tokens. False for a prefill
	// chunk that does not end the prompt.
	Sample bool
	// Params are the sequence's sampling parameters; read when Sample is
	// set. The pointer is shared across steps and must not be modified.
	Params *SamplingParams
	// Allowed, when not nil, restricts this step's sample to the tokens
	// whose bit is set: bit id%64 of word id/64, at least
	// MaskWords(VocabSize) words, one bit set at least (constrained
	// decoding fills it from a grammar). Disallowed tokens get a logit of
	// minus infinity before log-probabilities and sampling. Read when
	// Sample is set; the engine does not keep it past Step.
	Allowed []uint64
	// Loop and LoopSteps, when LoopSteps > 0, say that Allowed stays the
	// same for the next LoopSteps steps as long as each token sampled is
	// in Loop (same bit layout as Allowed; constrained decoding fills them
	// from grammar.Matcher.Loop). An engine may then decode up to
	// LoopSteps tokens ahead under Allowed, stopping after the first
	// token outside Loop (still valid: it was sampled under Allowed), and
	// serve them to the next steps without a round trip — but only to a
	// step whose Allowed equals, word for word, the mask they were decoded
	// under; it checks that and otherwise drops them and samples anew.
	// Read when Sample and Allowed are set; the engine does not keep them
	// past Step. Zero LoopSteps: no loop.
	Loop      []uint64
	LoopSteps int
	// Prev, only in a batch given to Pipeliner.StepAsync, feeds the token
	// this sequence samples in the pending step instead of Tokens, which
	// must be nil: the engine resolves it on its side, so the caller plans
	// a step before the previous step's tokens are back. Sample must be
	// set, Allowed nil, and the sequence must sample in the pending step.
	Prev bool
	// Opening, only in a batch given to Pipeliner.StepAsync, marks a
	// sequence's first prompt chunk sent before its OpenAsync was
	// answered: Tokens are the feed from its first token, and the engine
	// feeds only those past the prefix the Open reused, so the chunk may
	// go in the first step behind the open. The sequence holds
	// max(reused, len(Tokens)) tokens after the step. A chunk no longer
	// than the reused prefix feeds nothing; it must not sample (a chunk
	// that ends the feed never is: Open leaves a token to feed). If the
	// open fails, the input feeds nothing and, when it samples, its
	// output's Token is -1: the rest of the step runs, and the caller,
	// told by the open's Wait, drops the output.
	Opening bool
	// Last, with Sample, says the token this input samples is its
	// sequence's last: the caller will not step the sequence again (its
	// MaxTokens or the context is reached). An engine that computes a
	// sequence's next step before it is asked (the pyproc worker's
	// speculated decode step) leaves it out, so a request of one token
	// costs no decode step. A hint: an engine may ignore it, and a
	// sequence stepped again anyway still steps correctly.
	Last bool
}

// Feeds is the number of tokens the input appends to its sequence (for
// an Opening input, at most that many).
func (in StepInput) Feeds() int {
	if in.Prev {
		return 1
	}
	return len(in.Tokens)
}

// StepOutput is the token sampled for one StepInput with Sample set.
type StepOutput struct {
	Seq   SeqID
	Token int32
	// Logprob is the token's log-probability under the sampling
	// distribution's logits (before temperature; after penalties, logit
	// bias and the allowed mask), when Params.Logprobs was set; zero
	// otherwise.
	Logprob float32
	// Top holds the Params.TopLogprobs most likely tokens, most likely
	// first, under the same distribution as Logprob; nil when not asked.
	Top []TokenLogprob
	// Embedding is the pooled vector (Info.EmbedDim values, as pooled:
	// not normalized) of an embedding sequence (see Embedder) whose
	// input ended with this step; Token is then -1. Nil otherwise.
	Embedding []float32
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// Info describes a loaded model.
type Info struct {
	// ID is the name requests use.
	ID string
	// Engine names the engine that loaded it.
	Engine string
	// ContextLength is the most tokens (prompt + generated) one sequence
	// may hold.
	ContextLength int
	// VocabSize is the number of token ids the model produces.
	VocabSize int
	// BOS is the beginning-of-sequence token id, or -1 if none.
	BOS int32
	// EOS lists the token ids that end generation.
	EOS []int32
	// KVCapacity is the number of tokens the KV cache holds across all
	// open sequences.
	KVCapacity int
	// MaxBatch is the most inputs one Step takes.
	MaxBatch int
	// WeightBytes is the memory the model's weights take, in bytes, across
	// every copy the engine holds (one per worker process). Zero when the
	// engine cannot tell.
	WeightBytes int64
	// KVBytes is the memory reserved for the model's KV cache, in bytes,
	// across every copy. Zero when the engine cannot tell.
	KVBytes int64
	// TensorParallel is the number of devices one copy of the model is
	// split over (tensor parallel); 0 or 1: one. WeightBytes and KVBytes
	// count every device: one device holds about
	// WeightBytes / (copies * TensorParallel).
	TensorParallel int
	// BlockSize is the number of tokens one KV block holds when the model
	// keeps its KV in a pool of fixed-size blocks (paged, as vLLM's
	// PagedAttention): a sequence that was fed n tokens holds
	// ceil(n/BlockSize) blocks, taken as it grows, and sequences share
	// full prompt blocks by reference. Such a model implements BlockPool,
	// and KVCapacity is KVBlocks*BlockSize.
	//
	// Zero when the model does not page: KVCapacity tokens are then shared
	// by the open sequences and the caller reserves each sequence's whole
	// possible length (prompt + max tokens) when it opens it.
	BlockSize int
	// KVBlocks is the number of blocks in the pool; zero when BlockSize is.
	KVBlocks int
	// FullGroups and SlidingGroups split a model with sliding-window
	// layers into groups of layers of one kind, each with its own blocks
	// (vLLM's hybrid allocator): a block holds one group's layers for
	// BlockSize tokens, a sequence of n tokens holds ceil(n/BlockSize)
	// blocks in each full group and at most WindowBlocks in each sliding
	// group, whose blocks that left the Window return to the pool. Zero
	// SlidingGroups is one group of every layer, as before; KVCapacity
	// is then KVBlocks*BlockSize/(FullGroups+SlidingGroups).
	FullGroups, SlidingGroups int
	// Window is the sliding layers' window in tokens (informational).
	Window int
	// WindowBlocks is the most blocks a sequence holds in a sliding group.
	WindowBlocks int
	// StepTokens is the token budget per Step (decodes plus prompt
	// chunks) the engine runs best at, as measured on its device: too
	// small and prompts are cut into chunks that each pay a step's fixed
	// cost, too large and decodes wait behind long prefills. Zero leaves
	// the caller's default; a budget the caller sets wins.
	StepTokens int
	// Resumes reports that the model follows SamplingParams.Generated: a
	// sequence opened with the prompt plus the n tokens an earlier
	// sequence generated from it, sampling with the same parameters and
	// Generated set to n, samples exactly the tokens that earlier sequence
	// would have gone on to sample — a seeded draw is a function of the
	// seed and the generated position, and presence and frequency
	// penalties count the prompt's last n tokens as generated. "Exactly"
	// holds for the same logits: a step's arithmetic may round the
	// logits' last bits otherwise with the batch beside the sequence (or
	// for a prompt step against a decode step), and where a draw or an
	// argmax lands within that of a boundary between two tokens it picks
	// the other, as any two runs of one request in other batches may. The
	// batcher resumes a seeded or penalised sequence whose worker was
	// lost only on a model that reports it (greedy and unseeded ones
	// resume on any model); false fails such a sequence instead.
	Resumes bool
	// JumpForward reports that the model takes forced tokens after a
	// sampled one (jump-forward decoding of constrained output): once a
	// sequence has sampled, a StepInput whose Tokens hold more than one
	// token is the last sampled token followed by tokens the caller
	// appended without sampling, and the model counts every one of them
	// as generated — presence and frequency penalties count them, and a
	// run of k forced tokens advances the generated position of seeded
	// draws by k, so the draw after them is the one a sequence that had
	// sampled those same tokens would take. The batcher appends forced
	// tokens only on a model that reports it; false keeps one token per
	// decode step.
	JumpForward bool
	// EmbedDim is the length of the vectors the model pools (its hidden
	// size) when it implements Embedder; zero when it does not embed.
	EmbedDim int
	// Pooling and Normalize are how the checkpoint's vectors are made:
	// its sentence-transformers configuration, or its family's default
	// (see ReadPooling). The engine pools as asked (OpenPooled); the
	// caller normalizes.
	Pooling   Pooling
	Normalize bool
	// Encoder reports a bidirectional model (the BERT family): every token
	// attends to every other, so an input is fed in one Step, never in
	// chunks, and the model cannot generate: it only embeds (Open fails
	// with an *InvalidParamError). ContextLength is the most tokens one
	// input may hold.
	Encoder bool
	// Matryoshka reports that the checkpoint says its vectors keep their
	// meaning when truncated to their first dimensions (config.json's
	// is_matryoshka or matryoshka_dimensions), so a request may ask for
	// fewer dimensions.
	Matryoshka bool
	// MatryoshkaDims lists the dimensions the checkpoint was trained for,
	// when it lists them (matryoshka_dimensions); nil allows any.
	MatryoshkaDims []int
	// AdapterSlots is the number of LoRA adapters the model keeps
	// resident at once when it implements AdapterModel; zero when it
	// serves none. MaxAdapterRank is the highest rank it accepts.
	AdapterSlots   int
	MaxAdapterRank int
	// AdapterBytes is the device memory the adapter slots take once the
	// model runs its first adapter (every slot at MaxAdapterRank, on every
	// device); 0 when unknown. It is not part of MemoryBytes: a model that
	// never runs an adapter never takes it.
	AdapterBytes int64
}

// Paged reports whether the model keeps its KV in blocks (BlockSize > 0).
func (i Info) Paged() bool { return i.BlockSize > 0 && i.KVBlocks > 0 }

// Groups is the number of block groups (FullGroups+SlidingGroups), one
// when the model has no sliding groups.
func (i Info) Groups() int {
	if i.SlidingGroups <= 0 {
		return 1
	}
	return i.FullGroups + i.SlidingGroups
}

// BlocksFor is the number of blocks a sequence of n tokens holds:
// ceil(n/BlockSize), or with sliding groups FullGroups*ceil(n/BlockSize)
// + SlidingGroups*min(ceil(n/BlockSize), WindowBlocks). Zero for a model
// that does not page.
func (i Info) BlocksFor(n int) int {
	if !i.Paged() || n <= 0 {
		return 0
	}
	nb := (n + i.BlockSize - 1) / i.BlockSize
	if i.SlidingGroups <= 0 {
		return nb
	}
	return i.FullGroups*nb + i.SlidingGroups*min(nb, i.WindowBlocks)
}

// TokensFor is the most tokens a sequence of held tokens can be fed
// while it takes at most blocks more blocks: the inverse of BlocksFor's
// growth. math.MaxInt when feeding takes no more (every group slides
// and the windows are full).
func (i Info) TokensFor(held, blocks int) int {
	if !i.Paged() || blocks < 0 {
		return 0
	}
	bs := i.BlockSize
	nb := (held + bs - 1) / bs
	room := nb*bs - held // the last block's free rows
	if i.SlidingGroups <= 0 {
		return room + blocks*bs
	}
	if grow := i.FullGroups + i.SlidingGroups; nb < i.WindowBlocks {
		k := min(blocks/grow, i.WindowBlocks-nb)
		room += k * bs
		blocks -= k * grow
		if nb+k < i.WindowBlocks {
			return room
		}
	}
	if i.FullGroups == 0 {
		return math.MaxInt
	}
	return room + blocks/i.FullGroups*bs
}

// BlockPool is implemented by paged models (Info.BlockSize > 0). It lets
// the caller admit by blocks and grow sequences on demand instead of
// reserving their whole length up front.
//
// The accounting the caller relies on: after Open returns reused, the
// sequence holds BlocksFor(reused) blocks (full shared prefix blocks are
// referenced, not copied; a partly used last block is the sequence's own,
// copied when it was shared; with sliding groups, at most that many: the
// saved prefix may have given back blocks of the window's span that its
// window no longer read). Feeding n more tokens to a sequence that holds
// f tokens takes BlocksFor(f+n) - BlocksFor(f) blocks from the pool (at
// most that, after such an Open). Free
// returns a sequence's blocks except those still referenced by another
// sequence or kept for a saved prefix.
//
// FreeBlocks is serialised with Open, Step and Free like them.
type BlockPool interface {
	// FreeBlocks returns how many blocks sequences can take now: blocks
	// nobody holds plus blocks held only by saved prefixes or the prefix
	// cache, which the engine evicts (least recently used first) when a
	// sequence needs them. Open and Step fail with ErrOutOfMemory, and
	// change no sequence, when the blocks they need exceed it; a caller
	// that checks FreeBlocks first never sees that error.
	//
	// A model whose pool is split across workers, each sequence taking
	// blocks from its own worker's, reports their sum: a step or open
	// can then find one worker short while the sum has room, so the
	// promise above holds per worker only. Its Step runs the inputs of
	// the workers with room and returns a *PartialStepError (or fails
	// with ErrOutOfMemory when no worker with inputs had room); giving
	// back blocks of the inputs that did not run (preempting one of
	// their sequences) gives them to the worker that was short.
	FreeBlocks() int
}

// MemoryBytes is the model's weight plus KV memory: what unloading it
// frees. Zero when the engine reports neither.
func (i Info) MemoryBytes() int64 { return i.WeightBytes + i.KVBytes }

// Warmer is implemented by models that can prepare for traffic ahead of it.
// Warm runs the work a model otherwise does on its first requests —
// compiling kernels, capturing CUDA graphs, filling allocator pools — by
// running one decode step at each batch-size bucket the engine uses, on
// scratch memory of its own. It returns the batch sizes it warmed.
//
// Warm needs no open sequence and leaves the model's sequences, KV
// accounting and saved prefixes as they were. Unlike Open, Step and Free,
// Warm is safe to call while the model serves: the engine serialises it
// with the steps. If ctx ends, Warm returns ctx.Err() and the model stays
// usable (some buckets stay cold).
//
// The serving layer calls Warm when a model implements it, then runs a
// short real generation through the whole stack.
type Warmer interface {
	Warm(ctx context.Context) (batchSizes []int, err error)
}
