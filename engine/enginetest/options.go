package enginetest

import (
	"fmt"
	"math"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// Defaults of the simulated engine; options override them and a
// ModelSpec's MaxBatch, KVCapacity and ContextLength override those per
// model.
const (
	DefaultMaxBatch      = 64
	DefaultKVCapacity    = 1 << 20
	DefaultContextLength = 8192
	DefaultVocabSize     = 32000
	DefaultEOS           = int32(2)
	DefaultPrefixEntries = 256
	DefaultEmbedDim      = 32
)

// SimOption configures a [Sim]. Options with bad values make [NewSim]
// return an error wrapping [engine.ErrInvalidParam].
type SimOption func(*simConfig) error

type simConfig struct {
	stepFixed, stepPerToken time.Duration
	loadTime                time.Duration
	kvCapacity              int
	maxBatch                int
	contextLength           int
	vocabSize               int
	eos                     []int32
	eosProb                 float64
	prefixEntries           int
	compileTime             time.Duration
	weightBytes             int64
	adapterBytes            int64
	kvTokenBytes            int64
	blockSize               int
	noResume                bool
	noJumpForward           bool
	lossRate                float64
	lossSeed                uint64
	embedDim                int
	pooling                 engine.Pooling
	normalize               bool
	encoder                 bool
	matryoshka              bool
	noPipeline              bool
	pipelineAbove           int
}

func defaultConfig() simConfig {
	return simConfig{
		kvCapacity:    DefaultKVCapacity,
		maxBatch:      DefaultMaxBatch,
		contextLength: DefaultContextLength,
		vocabSize:     DefaultVocabSize,
		eos:           []int32{DefaultEOS},
		prefixEntries: DefaultPrefixEntries,
		embedDim:      DefaultEmbedDim,
		pooling:       engine.PoolLast,
		normalize:     true,
	}
}

func badOption(name string, v any, want string) error {
	return &engine.InvalidParamError{Param: name, Reason: fmt.Sprintf("%v is out of range: want %s", v, want)}
}

// WithStepTime makes every Step take fixed + perToken*(tokens fed in the
// batch), measured from the call, honouring the Step's context. The wait
// is on a timer, then for its last tenth (at most 1 ms) on the clock,
// polled between yields, so that a step ends when it should rather than
// when a late OS timer fires (SimStats.Polled is the CPU that costs).
// Default 0, 0: steps return at once.
func WithStepTime(fixed, perToken time.Duration) SimOption {
	return func(c *simConfig) error {
		if fixed < 0 || perToken < 0 {
			return badOption("step time", fmt.Sprintf("%v + %v/token", fixed, perToken), "0 or more")
		}
		c.stepFixed, c.stepPerToken = fixed, perToken
		return nil
	}
}

// WithLoadTime makes every Load take d, honouring its context. Default 0.
func WithLoadTime(d time.Duration) SimOption {
	return func(c *simConfig) error {
		if d < 0 {
			return badOption("load time", d, "0 or more")
		}
		c.loadTime = d
		return nil
	}
}

// WithKVCapacity sets each model's KV capacity in tokens across its open
// sequences. Default [DefaultKVCapacity].
func WithKVCapacity(tokens int) SimOption {
	return func(c *simConfig) error {
		if tokens < 1 {
			return badOption("kv capacity", tokens, "1 or more")
		}
		c.kvCapacity = tokens
		return nil
	}
}

// WithMaxBatch sets the most inputs one Step takes. Default
// [DefaultMaxBatch].
func WithMaxBatch(n int) SimOption {
	return func(c *simConfig) error {
		if n < 1 {
			return badOption("max batch", n, "1 or more")
		}
		c.maxBatch = n
		return nil
	}
}

// WithContextLength sets the most tokens one sequence holds. Default
// [DefaultContextLength].
func WithContextLength(n int) SimOption {
	return func(c *simConfig) error {
		if n < 2 {
			return badOption("context length", n, "2 or more")
		}
		c.contextLength = n
		return nil
	}
}

// WithVocabSize sets the number of token ids; tokens are drawn from
// [0, n). Default [DefaultVocabSize].
func WithVocabSize(n int) SimOption {
	return func(c *simConfig) error {
		if n < 2 || n > math.MaxInt32 {
			return badOption("vocab size", n, "2 to 2^31-1")
		}
		c.vocabSize = n
		return nil
	}
}

// WithEOS sets the end-of-sequence ids reported in Info.EOS. Default
// {[DefaultEOS]}. The simulated engine emits them only as
// [WithEOSProbability] says; no ids means no EOS at all.
func WithEOS(ids ...int32) SimOption {
	return func(c *simConfig) error {
		c.eos = append([]int32(nil), ids...)
		return nil
	}
}

// WithEOSProbability sets the chance in [0, 1) that a sampled token is an
// EOS id. The choice is deterministic — a function of the sequence's
// history like every other token — so the same prompt ends at the same
// place every time, while some sequences end early. Default 0: EOS never
// appears.
func WithEOSProbability(p float64) SimOption {
	return func(c *simConfig) error {
		if math.IsNaN(p) || p < 0 || p >= 1 {
			return badOption("eos probability", p, "0 to below 1")
		}
		c.eosProb = p
		return nil
	}
}

// WithPrefixCacheEntries bounds, per model, how many sequences saved by
// Free with a key are kept for prefix reuse (least recently used go
// first). Saved KV never counts against KV capacity. Default
// [DefaultPrefixEntries].
func WithPrefixCacheEntries(n int) SimOption {
	return func(c *simConfig) error {
		if n < 1 {
			return badOption("prefix cache entries", n, "1 or more")
		}
		c.prefixEntries = n
		return nil
	}
}

// WithBlockSize makes every model keep its KV in a pool of blocks of n
// tokens (a paged model, see [engine.BlockPool]): KVCapacity/n blocks,
// taken as sequences are fed rather than reserved at Open, so admission
// and preemption by blocks can be exercised without a GPU. The context is
// capped at what the pool holds. Saved prefixes still live apart from the
// pool. Default 0: the model reserves each prompt's KV at Open.
func WithBlockSize(n int) SimOption {
	return func(c *simConfig) error {
		if n < 0 {
			return badOption("block size", n, "0 (not paged) or more")
		}
		c.blockSize = n
		return nil
	}
}

// WithEmbedding sets what the models embed (engine.Embedder): vectors of
// dim values pooled with pooling, normalized or not, and whether they may
// be truncated (engine.Info.Matryoshka). Dim 0 makes models that do not
// embed. Without it models embed DefaultEmbedDim values, last-token
// pooled and normalized, not Matryoshka.
func WithEmbedding(dim int, pooling engine.Pooling, normalize, matryoshka bool) SimOption {
	return func(c *simConfig) error {
		if dim < 0 {
			return badOption("embed dim", dim, "0 (no embedding) or more")
		}
		if dim > 0 && (pooling < engine.PoolMean || pooling > engine.PoolLast) {
			return badOption("pooling", pooling, "mean, cls or lasttoken")
		}
		c.embedDim, c.pooling, c.normalize, c.matryoshka = dim, pooling, normalize, matryoshka
		return nil
	}
}

// WithEncoder makes the models encoders (engine.Info.Encoder): they only
// embed, their inputs come whole in one step, and a token's hidden state
// depends on the whole input.
func WithEncoder() SimOption {
	return func(c *simConfig) error {
		c.encoder = true
		return nil
	}
}

// validate checks what single options cannot: how they combine.
func (c *simConfig) validate() error {
	if c.encoder && c.embedDim == 0 {
		return badOption("embed dim", 0, "more than 0 for an encoder")
	}
	if c.eosProb > 0 && len(c.eos) == 0 {
		return badOption("eos probability", c.eosProb, "0 when there are no EOS ids")
	}
	if c.blockSize > c.kvCapacity {
		return badOption("block size", c.blockSize, fmt.Sprintf("at most the KV capacity %d", c.kvCapacity))
	}
	if len(c.eos) >= c.vocabSize {
		return badOption("eos", c.eos, fmt.Sprintf("fewer ids than the vocab size %d", c.vocabSize))
	}
	for _, id := range c.eos {
		if id < 0 || int(id) >= c.vocabSize {
			return badOption("eos", id, fmt.Sprintf("an id in [0, %d)", c.vocabSize))
		}
	}
	return nil
}

// WithCompileTime makes the first Step at each batch-size bucket (powers
// of two up to the max batch, see [SimBuckets]) take d longer, the way a
// real engine compiles kernels or captures a CUDA graph the first time it
// sees a shape. Warm pays that cost ahead of traffic. Default 0.
func WithCompileTime(d time.Duration) SimOption {
	return func(c *simConfig) error {
		if d < 0 {
			return badOption("compile time", d, "0 or more")
		}
		c.compileTime = d
		return nil
	}
}

// WithAdapterMemory sets the memory each model reports its LoRA adapter
// slots take once it runs an adapter (Info.AdapterBytes). Default 0.
func WithAdapterMemory(bytes int64) SimOption {
	return func(c *simConfig) error {
		if bytes < 0 {
			return badOption("adapter memory", bytes, "0 or more")
		}
		c.adapterBytes = bytes
		return nil
	}
}

// WithMemory sets the memory each model reports in its Info: weightBytes
// for the weights and kvTokenBytes per token of KV capacity. Nothing is
// allocated; the figures let a memory budget be exercised. Default 0, 0:
// the models report no memory.
func WithMemory(weightBytes, kvTokenBytes int64) SimOption {
	return func(c *simConfig) error {
		if weightBytes < 0 || kvTokenBytes < 0 {
			return badOption("memory", fmt.Sprintf("%d + %d/token", weightBytes, kvTokenBytes), "0 or more")
		}
		c.weightBytes, c.kvTokenBytes = weightBytes, kvTokenBytes
		return nil
	}
}

// WithoutResume makes every model behave as an engine that does not
// follow Generated of [engine.SamplingParams]: Info.Resumes is false, a
// seeded draw restarts at the first generated position of every Open and
// presence and frequency penalties count only tokens fed after the first
// sample. It lets the serving layer's handling of such engines be tested
// (and shows the conformance check failing). Default: models resume.
func WithoutResume() SimOption {
	return func(c *simConfig) error {
		c.noResume = true
		return nil
	}
}

// WithoutJumpForward makes every model behave as an engine that does not
// take forced tokens: Info.JumpForward is false, and a run of tokens fed
// with a sample after the first does not advance the generated position
// of seeded draws beyond one. Default: models report Info.JumpForward.
func WithoutJumpForward() SimOption {
	return func(c *simConfig) error {
		c.noJumpForward = true
		return nil
	}
}

// WithWorkerLoss makes Steps fail as if the engine's worker died: each
// Step fails with probability rate, an error wrapping
// [engine.ErrWorkerLost], before it changes anything, and the batch's
// sequences are lost with the worker — stepping them again fails the same
// way; Free releases them and a new Open works. The choice is a
// deterministic function of seed and the count of Steps, so a run can be
// repeated. Default 0: no Step fails.
func WithWorkerLoss(rate float64, seed uint64) SimOption {
	return func(c *simConfig) error {
		if math.IsNaN(rate) || rate < 0 || rate >= 1 {
			return badOption("worker loss rate", rate, "0 to below 1")
		}
		c.lossRate, c.lossSeed = rate, seed
		return nil
	}
}

// WithoutPipeline makes models that do not implement [engine.Pipeliner],
// as an engine that cannot send a step before the previous one's tokens
// are read (the MLX engine), so that the serving layer's synchronous
// loop can be tested. Default: models implement it.
func WithoutPipeline() SimOption {
	return func(c *simConfig) error {
		c.noPipeline = true
		return nil
	}
}

// WithPipelineAbove makes StepAsync decline (ok false, nothing sent)
// batches of n inputs or fewer, as pyproc does for the small batches its
// own lookahead decodes better, so that the serving layer's switching
// between pipelined and synchronous steps can be tested. Default 0:
// StepAsync takes every batch.
func WithPipelineAbove(n int) SimOption {
	return func(c *simConfig) error {
		if n < 0 {
			return badOption("pipeline above", n, "0 or more")
		}
		c.pipelineAbove = n
		return nil
	}
}
