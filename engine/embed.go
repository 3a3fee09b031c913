package engine

import (
	"context"
	"fmt"
)

// Pooling says how an embedding sequence's per-token hidden states (the
// model's last hidden state, after its final norm) become one vector.
type Pooling uint8

const (
	// PoolNone marks a generating sequence.
	PoolNone Pooling = iota
	// PoolMean averages the hidden states of every token of the input.
	PoolMean
	// PoolCLS takes the first token's hidden state (BERT's [CLS]).
	PoolCLS
	// PoolLast takes the last token's hidden state, the one a causal model
	// has read the whole input with (Qwen3-Embedding, gte-Qwen2, e5-mistral).
	PoolLast
)

// String returns the pooling's name as sentence-transformers spells its
// mode: "mean", "cls", "lasttoken"; "none" for PoolNone.
func (p Pooling) String() string {
	switch p {
	case PoolNone:
		return "none"
	case PoolMean:
		return "mean"
	case PoolCLS:
		return "cls"
	case PoolLast:
		return "lasttoken"
	}
	return fmt.Sprintf("Pooling(%d)", uint8(p))
}

// Embedder is implemented by models that return pooled hidden states
// (Info.EmbedDim > 0). An embedding sequence is prefill only: it is opened
// with OpenPooled, fed its input in Steps like a prompt (in chunks, or in
// one Step on an Info.Encoder model), and the input that ends it has
// Sample set: its StepOutput carries the pooled vector in Embedding
// instead of a token. The caller then frees it; nothing is saved.
//
// OpenPooled is serialised with Open, Step and Free like them.
type Embedder interface {
	// OpenPooled starts embedding sequence id for input, pooled with pool
	// (never PoolNone). Unlike Open it reuses no saved or cached KV —
	// pooling reads every token's hidden state — and the sequence is
	// never saved: Free ignores its saveKey.
	//
	// Errors: as Open's (*ContextLengthError when input does not fit the
	// context, ErrOutOfMemory, ErrWorkerLost, ErrClosed), and an
	// *InvalidParamError for a pooling the model cannot do.
	OpenPooled(ctx context.Context, id SeqID, input []int32, pool Pooling) error
}

// PoolingConfig is what a checkpoint says about its embeddings, from
// sentence-transformers' files (see ReadPooling).
type PoolingConfig struct {
	// Pooling is the pooling mode.
	Pooling Pooling
	// Normalize reports that vectors are L2-normalized.
	Normalize bool
	// MaxLength is sentence_bert_config.json's max_seq_length: the most
	// tokens the model was trained to embed; 0 when not given.
	MaxLength int
	// Published reports that the checkpoint has sentence-transformers
	// files; false means the values are the family's defaults.
	Published bool
	// Matryoshka and MatryoshkaDims are config.json's is_matryoshka and
	// matryoshka_dimensions (see Info.Matryoshka).
	Matryoshka     bool
	MatryoshkaDims []int
}

// ReadPooling reads a checkpoint's sentence-transformers configuration:
// modules.json, the Pooling module's config.json (1_Pooling/ as
// published) and sentence_bert_config.json. Without modules.json it
// returns the defaults: mean pooling for an encoder, last-token pooling
// for a decoder, normalized. It also reads config.json's Matryoshka
// fields.
//
// A pipeline this engine cannot reproduce exactly — max or weighted-mean
// pooling, a Dense projection or any module after pooling other than
// Normalize — is refused with a *CheckpointError naming the module:
// serving it without that step would return vectors that silently differ
// from the published model's.
func ReadPooling(dir string, encoder bool) (PoolingConfig, error) {
	return readPooling(dir, encoder)
}
