package batcher

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Option configures a ContinuousBatcher.
type Option func(*config) error

type config struct {
	maxBatch       int // 0 until resolved: the engine's MaxBatch
	tokenBudget    int
	tokenBudgetSet bool // WithTokenBudget given: the engine's StepTokens does not apply
	targetStep     time.Duration
	minBatch       int
	retry          *retry.Policy
	observer       func(StepStats)
	onResume       func(ResumeStats)
	logger         *slog.Logger
	noJumpForward  bool // WithJumpForward(false)
	serialText     bool // WithTextBehindStep(false)
	noPipeline     bool // WithPipeline(false)
	jumpForward    bool // resolved: on and the model takes forced tokens
	embedShare     float64
}

// Defaults.
const (
	// DefaultTokenBudget is the most tokens (decode tokens plus prompt
	// chunk tokens) one step carries.
	DefaultTokenBudget = 2048
	// DefaultEmbedShare is the share of a step's token budget embedding
	// inputs take at most while generating sequences run.
	DefaultEmbedShare = 0.25
	// DefaultRecoveries is how often a sequence whose engine worker was
	// lost before its first token is started again before its stream
	// fails.
	DefaultRecoveries = 2
)

// defaultRetry is the policy of DefaultRecoveries: short waits, as the
// engine's own Open waits for a replacement worker.
func defaultRetry(recoveries int) *retry.Policy {
	return retry.MustPolicy(retry.WithMaxAttempts(recoveries+1),
		retry.WithBackoff(10*time.Millisecond, time.Second, 2), retry.WithJitter(0.2))
}

func defaultConfig() config {
	return config{
		tokenBudget: DefaultTokenBudget,
		retry:       defaultRetry(DefaultRecoveries),
		minBatch:    1,
		embedShare:  DefaultEmbedShare,
		logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// CheckOptions applies opts to a default configuration and returns the
// first option's error, or the error of options that contradict each
// other whatever the model (a minimum batch above the maximum), so a
// program that builds batchers later (the root Server, at each model
// load) can refuse bad options up front. Limits that depend on the model
// (the batch limit against the token budget) are checked by New.
func CheckOptions(opts ...Option) error {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return err
		}
	}
	return cfg.checkBatch()
}

// checkBatch refuses a minimum batch above a maximum that is set.
func (c *config) checkBatch() error {
	if c.maxBatch > 0 && c.minBatch > c.maxBatch {
		return fmt.Errorf("minimum batch %d is above the maximum %d", c.minBatch, c.maxBatch)
	}
	return nil
}

// resolve fills limits that depend on the model and checks consistency.
func (c *config) resolve(info engine.Info) error {
	if c.maxBatch == 0 || c.maxBatch > info.MaxBatch {
		c.maxBatch = info.MaxBatch
	}
	if err := c.checkBatch(); err != nil {
		return err
	}
	if !c.tokenBudgetSet && info.StepTokens > 0 {
		c.tokenBudget = max(info.StepTokens, c.maxBatch)
	}
	c.jumpForward = !c.noJumpForward && info.JumpForward
	if c.tokenBudget < c.maxBatch {
		return fmt.Errorf("token budget %d is below the batch limit %d: decoding sequences alone would not fit", c.tokenBudget, c.maxBatch)
	}
	return nil
}

// WithMaxBatch caps the sequences running at once. Zero (the default) uses
// the engine's MaxBatch; a larger value is lowered to it.
func WithMaxBatch(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("max batch %d is negative", n)
		}
		c.maxBatch = n
		return nil
	}
}

// WithTokenBudget caps the tokens one step carries: one per decoding
// sequence plus prompt chunks. Smaller budgets keep decode steps short while
// long prompts prefill; larger ones prefill faster. Default: the engine's
// Info.StepTokens, else DefaultTokenBudget; it must be at least the batch
// limit.
func WithTokenBudget(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("token budget %d must be at least 1", n)
		}
		c.tokenBudget, c.tokenBudgetSet = n, true
		return nil
	}
}

// WithEmbedShare sets the share of a step's token budget that embedding
// inputs (Sequence.Pool) take at most while generating sequences run,
// from 0 (exclusive) to 1: prompt chunks of generating sequences go
// first, embeddings fill what is left up to this share, and while
// sequences decode they join every other step only, so embedding traffic
// costs chat a bounded slowdown of its decode steps and its time to first
// token. Without generating sequences embeddings take every step's whole
// budget. Default DefaultEmbedShare.
func WithEmbedShare(f float64) Option {
	return func(c *config) error {
		if !(f > 0 && f <= 1) {
			return fmt.Errorf("embed share %v: want more than 0, at most 1", f)
		}
		c.embedShare = f
		return nil
	}
}

// WithJumpForward turns jump-forward decoding of constrained sequences
// on or off. On (the default), where the model reports
// engine.Info.JumpForward and a sequence's Constraint implements Forcer:
// after each sampled token the tokens the grammar forces next (a key
// name, '":', a closing brace, the rest of an enum value) are appended at
// once and fed with the next step's input, instead of costing a forward
// pass each. They count against the step's token budget, the sequence's
// MaxTokens and its KV like sampled tokens, reach the caller as chunks
// like sampled ones, are counted in api.Usage.ForcedTokens, and stop
// tokens, stop strings and the end of the document apply to them as to
// sampled ones. A sequence that asks for log-probabilities
// (SamplingParams.Logprobs, TopLogprobs) is sampled token by token:
// forced tokens would have none to report. A sequence resumed inside a
// forced run gets the rest of it first (Sequence.Forced). On a model that
// does not report Info.JumpForward it stays off.
func WithJumpForward(on bool) Option {
	return func(c *config) error {
		c.noJumpForward = !on
		return nil
	}
}

// WithTextBehindStep sets whether a step's text work runs behind the next
// step (on by default): the detokenizing of each sampled token and its
// chunk's hand-off to the reader, for sequences that neither finish with
// the token nor have a constraint or stop strings (nothing the next step's
// inputs depend on), after their first token (which goes out at once).
// The batcher starts that work in a goroutine of its own when it calls
// the engine's Step, and waits for it when Step returns, so the engine waits for the batcher's bookkeeping only, and a
// chunk reaches its reader about the batcher's admission and input
// building later than it would otherwise (StepStats.Between, a fraction
// of a step). Off, every token's text work runs before the next step's
// inputs are built.
func WithTextBehindStep(on bool) Option {
	return func(c *config) error {
		c.serialText = !on
		return nil
	}
}

// WithPipeline sets whether the batcher sends a step before it has read
// the previous step's tokens, on a model that implements
// engine.Pipeliner (on by default): the engine then finds the next step
// waiting when it finishes one, and the batcher's own work between steps
// (delivering tokens, admission, planning) and the trip to the engine
// run while the device runs the previous step. The next step is planned
// when the one before it starts, so under load a new request starts a
// step later than it would otherwise (its first chunk goes in the step
// sent right behind its open: engine.StepInput.Opening); a sequence that
// stops on a token other than by its length has one row run for nothing.
// While a constrained sequence runs, and around preemptions and
// synchronous opens (adapters, embeddings), steps are synchronous. Off,
// every step waits for the one before it.
func WithPipeline(on bool) Option {
	return func(c *config) error {
		c.noPipeline = !on
		return nil
	}
}

// JumpForward reports whether the batcher appends forced tokens
// (WithJumpForward on and the model reports engine.Info.JumpForward).
func (b *ContinuousBatcher) JumpForward() bool { return b.cfg.jumpForward }

// WithTargetStepLatency turns on adaptive batch sizing: the batch limit
// moves between minBatch and the maximum so that the moving average of
// step latency stays near target (additive increase while below, a tenth
// off while above). Zero target (the default) turns it off and the limit
// stays at the maximum.
func WithTargetStepLatency(target time.Duration, minBatch int) Option {
	return func(c *config) error {
		if target < 0 {
			return errors.New("target step latency is negative")
		}
		if minBatch < 1 {
			return fmt.Errorf("minimum batch %d must be at least 1", minBatch)
		}
		c.targetStep, c.minBatch = target, minBatch
		return nil
	}
}

// WithRecoveries sets how often a sequence whose engine worker was lost
// before its first token is started again before its stream fails: the
// default retry policy with n+1 attempts. Zero fails at once.
func WithRecoveries(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("recoveries %d is negative", n)
		}
		c.retry = defaultRetry(n)
		return nil
	}
}

// WithRetryPolicy sets the policy for sequences whose attempt failed with
// an error the policy retries (a lost worker): they are requeued after the
// policy's wait and run again, up to its attempts and elapsed time: from
// their prompt, or, after tokens reached the caller, resuming from the
// prompt plus those tokens (see the package doc for which sequences can).
// A resumed sequence that delivers a token starts the policy afresh: the
// attempts bound the failures between two tokens, not over a stream's
// life.
func WithRetryPolicy(p *retry.Policy) Option {
	return func(c *config) error {
		if p == nil {
			return errors.New("retry policy is nil")
		}
		c.retry = p
		return nil
	}
}

// WithStepObserver calls fn after every engine step, on the batcher's
// goroutine: it must return quickly (record metrics, nothing blocking).
func WithStepObserver(fn func(StepStats)) Option {
	return func(c *config) error {
		c.observer = fn
		return nil
	}
}

// WithResumeObserver calls fn when a resumed sequence (see
// WithRetryPolicy) delivers its first token after the resume, on the
// batcher's goroutine: it must return quickly.
func WithResumeObserver(fn func(ResumeStats)) Option {
	return func(c *config) error {
		c.onResume = fn
		return nil
	}
}

// WithLogger sets the logger. The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("logger is nil")
		}
		c.logger = l
		return nil
	}
}
