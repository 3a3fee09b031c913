package api

import "time"

// MaxEmbedInputs is the most inputs one EmbedRequest may carry (OpenAI's
// limit for /v1/embeddings).
const MaxEmbedInputs = 2048

// EmbedRequest asks for one vector per input, from a model that embeds
// (engine.Info.EmbedDim > 0). The inputs run as prefill-only sequences in
// the model's batches, beside generating requests, with the same tiers,
// deadlines and cancellation.
type EmbedRequest struct {
	// Model is the id of a model that embeds.
	Model string
	// Inputs are the texts or token sequences to embed, one vector each,
	// in order. At least one, at most MaxEmbedInputs; none empty.
	Inputs []EmbedInput
	// Dimensions, when positive, truncates each vector to its first
	// Dimensions values (Matryoshka representation), normalized again when
	// the model normalizes. Only for a model that says its vectors may be
	// truncated (engine.Info.Matryoshka); zero keeps every dimension.
	Dimensions int
	// Truncate cuts an input longer than the model takes instead of
	// refusing the request with a context-length error: a text's own
	// tokens are cut and the tokenizer's special tokens still added
	// (a BERT input keeps its [CLS] and [SEP]); token ids keep their
	// first tokens.
	Truncate bool
	// Priority is the request's tier. The zero value is Normal.
	Priority Tier
	// Client identifies the caller for per-client rate limits.
	Client string
	// Deadlines bound the request's time: Total (or FirstToken, which for
	// an embedding is the same instant) from submission to the vectors.
	Deadlines Deadlines
	// Cache lets a server with a response cache answer identical inputs
	// of the same model from it and keep these for later.
	Cache bool
}

// EmbedInput is one input: a text, tokenized with the model's tokenizer
// (special tokens added as the tokenizer's post-processor says), or token
// ids, used as given.
type EmbedInput struct {
	Text   string
	Tokens []int32
}

// Embeddings is the answer to an EmbedRequest.
type Embeddings struct {
	// Model is the model that embedded the inputs.
	Model string
	// Vectors holds one vector per input, in input order.
	Vectors [][]float32
	// PromptTokens is the number of input tokens embedded (after
	// truncation), over every input.
	PromptTokens int
	// Cached counts the inputs answered from the response cache or by an
	// identical input in flight.
	Cached int
	// Duration is the time from submission to the last vector.
	Duration time.Duration
}
