package api

import "time"

// FinishReason says why a sequence stopped generating.
type FinishReason string

const (
	// FinishStop means an end-of-sequence token, a stop token or a stop
	// string ended generation.
	FinishStop FinishReason = "stop"
	// FinishLength means the sequence reached its token limit or the
	// model's context.
	FinishLength FinishReason = "length"
)

// Chunk is one piece of a sequence's output: a generated token with the text
// it completed, or the final chunk carrying the finish reason and usage.
type Chunk struct {
	// Text is the new text; it may be empty while a multi-byte character
	// or a possible stop string is held back.
	Text string
	// Token is the generated token id; valid when HasToken is set.
	Token    int32
	HasToken bool
	// Logprob is the token's log-probability, when requested.
	Logprob float32
	// Top lists the most likely tokens and their log-probabilities, most
	// likely first, when Sampling.TopLogprobs asked for them.
	Top []TopLogprob
	// Embedding is an embedding sequence's vector, on its last chunk
	// (the only one it has); nil for generated output.
	Embedding []float32
	// Finish is set on the last chunk only.
	Finish FinishReason
	// Usage is set on the last chunk only.
	Usage *Usage
}

// Usage counts a finished sequence's tokens and times.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// ForcedTokens is how many of CompletionTokens were appended by
	// jump-forward decoding (constrained output the grammar forced)
	// instead of being sampled one forward pass each.
	ForcedTokens int
	// ClosingTokens is how many of CompletionTokens were generated after
	// the budget (MaxTokens, or the context left) first made constrained
	// output close: from then on only tokens that keep the document
	// closable within the budget were sampled (see Params.KeepCut). Zero
	// when the budget never restricted it.
	ClosingTokens int
	// CachedTokens is the number of prompt tokens whose KV was reused
	// from a saved prefix instead of being prefilled.
	CachedTokens int
	// QueueWait is the time from submission to first admission.
	QueueWait time.Duration
	// TimeToFirstToken is the time from submission to the first token.
	TimeToFirstToken time.Duration
	// Duration is the time from submission to the end.
	Duration time.Duration
	// Preemptions counts how often the sequence was evicted and
	// recomputed (preemption or a lost worker).
	Preemptions int
	// Resumes counts how often the stream went on after its engine worker
	// (or, through a load balancer, its backend) was lost after tokens
	// had reached the caller; ResumeGap is the time those resumes added,
	// from the last token before each loss to the first after it.
	Resumes   int
	ResumeGap time.Duration
	// Backend names the backend that finished the stream, when a load
	// balancer routed it (it differs from Header.Backend after a resume
	// on another backend).
	Backend string
}

// TopLogprob is one of the most likely tokens at a step.
type TopLogprob struct {
	Token int32
	// Text is the token's text (its bytes, which may be part of a
	// character), filled by the server when the model has a tokenizer.
	Text    string
	Logprob float32
}
