package batcher

import "time"

// StepStats describes one engine step.
type StepStats struct {
	// Batch is the number of sequences in the step.
	Batch int
	// Decode is the number of sequences that fed one generated token.
	Decode int
	// PrefillTokens is the number of prompt tokens fed.
	PrefillTokens int
	// Latency is the engine's step time.
	Latency time.Duration
	// Between is the batcher's own time before the step: from the
	// previous step's return (its tokens delivered, admission, this
	// step's inputs built) to this step's call. Zero for the first step
	// after the batcher waited for work. An engine that overlaps the
	// device with its host (the torch engine runs the next decode step
	// while the batcher works) hides it up to a step's time.
	Between time.Duration
}

// ResumeStats describes one resumed sequence, reported when its first
// token after the resume reached the caller.
type ResumeStats struct {
	// Cause is why the sequence resumed: ResumeWorkerLost.
	Cause string
	// Delivered is the number of tokens the caller had before the resume.
	Delivered int
	// Gap is the time the resume added: from the step that produced the
	// last token before the loss to the step that produced the first
	// token after it.
	Gap time.Duration
}

// ResumeWorkerLost is the cause of a resume after the engine's worker
// was lost (engine.ErrWorkerLost).
const ResumeWorkerLost = "worker_lost"

// Stats is a snapshot of a batcher.
type Stats struct {
	// Steps is the number of engine steps run.
	Steps uint64
	// Inputs counts the sequences in those steps: Inputs/Steps is the
	// mean batch.
	Inputs uint64
	// DecodeTokens and PrefillTokens count tokens fed to the engine.
	DecodeTokens  uint64
	PrefillTokens uint64
	// Running is the number of sequences in the batch, as of the
	// scheduler loop's last turn (a sequence's final chunk can reach its
	// caller a moment before the next turn counts it out).
	Running int
	// KVReserved is the KV tokens reserved by running sequences; on a
	// paged model, the tokens the blocks in use hold (the pool less its
	// free blocks, as of the last step).
	KVReserved int
	// KVCapacity is the engine's KV capacity in tokens.
	KVCapacity int
	// Limit is the current batch limit (adaptive sizing moves it).
	Limit int
	// StepLatency is the moving average of step latency.
	StepLatency time.Duration
	// Last is the most recent step.
	Last StepStats
	// Resumed counts sequences whose worker was lost after tokens reached
	// the caller and that went on from where they stopped (recomputing
	// prompt plus delivered tokens on a live worker).
	Resumed uint64
	// KVBlocks and FreeBlocks describe a paged model's pool (zero when
	// the model does not page): its size, and its free blocks as of the
	// last step.
	KVBlocks, FreeBlocks int
	// BlockPreemptions counts sequences preempted because the pool ran
	// out of blocks; each recomputes when admitted again.
	BlockPreemptions uint64
	// PartialSteps counts steps the engine ran in part
	// (engine.PartialStepError): one of its workers left its inputs
	// unchanged, short of blocks in its own pool, while the others ran
	// theirs. Those inputs step again.
	PartialSteps uint64
	// Pipelined counts steps sent before the previous step's tokens were
	// read (WithPipeline), and Drains the times the batcher waited for a
	// pending step before planning the next (a constrained sequence, a
	// preemption, a synchronous open, a failure).
	Pipelined, Drains uint64
}

// Stats returns a snapshot. Safe for concurrent use.
func (b *ContinuousBatcher) Stats() Stats {
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	return b.stats
}

// observe records a step, runs the adaptive batch controller and calls the
// step observer.
func (b *ContinuousBatcher) observe(st StepStats) {
	const alpha = 0.2
	if b.emaStep == 0 {
		b.emaStep = st.Latency
	} else {
		b.emaStep = time.Duration(alpha*float64(st.Latency) + (1-alpha)*float64(b.emaStep))
	}
	b.adapt(st)

	b.statsMu.Lock()
	b.stats.Steps++
	b.stats.Inputs += uint64(st.Batch)
	b.stats.DecodeTokens += uint64(st.Decode)
	b.stats.PrefillTokens += uint64(st.PrefillTokens)
	b.stats.StepLatency = b.emaStep
	b.stats.Limit = b.limit
	b.stats.Last = st
	b.statsMu.Unlock()

	if b.cfg.observer != nil {
		b.cfg.observer(st)
	}
}

// adapt moves the batch limit toward the target step latency: one more
// sequence while the average is comfortably below target and the batch is
// full, a tenth fewer while it is above.
func (b *ContinuousBatcher) adapt(st StepStats) {
	target := b.cfg.targetStep
	if target == 0 {
		return
	}
	switch {
	case b.emaStep > target+target/10 && b.limit > b.cfg.minBatch:
		b.limit = max(b.cfg.minBatch, b.limit-max(1, b.limit/10))
	case b.emaStep < target-target/10 && st.Batch >= b.limit && b.limit < b.cfg.maxBatch:
		b.limit++
	}
}

// count adds one to a counter of b.stats (&b.stats.Resumed, ...).
func (b *ContinuousBatcher) count(n *uint64) {
	b.statsMu.Lock()
	*n++
	b.statsMu.Unlock()
}

// publishOccupancy updates the running and KV figures.
func (b *ContinuousBatcher) publishOccupancy() {
	b.statsMu.Lock()
	b.stats.Running = len(b.running)
	b.stats.KVReserved = b.reserved
	b.stats.KVCapacity = b.info.KVCapacity
	if b.pool != nil {
		b.stats.KVReserved = (b.info.KVBlocks - b.lastFree) * b.info.BlockSize
		b.stats.KVBlocks, b.stats.FreeBlocks = b.info.KVBlocks, b.lastFree
	}
	b.statsMu.Unlock()
}
