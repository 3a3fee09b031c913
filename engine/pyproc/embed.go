package pyproc

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

var _ engine.Embedder = (*Model)(nil)

// pooledSeq is an open embedding sequence: its pooling, and whether the
// input that ends it has been fed (it then takes no more input).
type pooledSeq struct {
	pool  engine.Pooling
	ended bool
}

// OpenPooled starts embedding sequence id (engine.Embedder). It goes
// where Open sends a sequence without a prefix key, and reuses nothing.
// Errors: as Open's, and an *engine.InvalidParamError when the model does
// not embed (Info.EmbedDim is 0: the MLX backend) or pool is not mean,
// cls or lasttoken.
func (m *Model) OpenPooled(ctx context.Context, id engine.SeqID, input []int32, pool engine.Pooling) error {
	if err := m.usable(); err != nil {
		return err
	}
	switch {
	case m.info.EmbedDim == 0:
		return &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q does not embed", m.spec.ID)}
	case pool != engine.PoolMean && pool != engine.PoolCLS && pool != engine.PoolLast:
		return &engine.InvalidParamError{Param: "pooling", Reason: fmt.Sprintf("%v: want mean, cls or lasttoken", pool)}
	}
	_, err := m.open(ctx, id, input, "", pool)
	return err
}

// checkPooled refuses, before anything is sent, the inputs a pooled
// sequence cannot take: any after the input that ended it, an encoder's
// input that does not come whole (in one input that samples), and an
// encoder step carrying more tokens to one worker than its step holds.
func (m *Model) checkPooled(batch []engine.StepInput) error {
	if len(m.pooled) == 0 {
		return nil
	}
	var perProc map[*proc]int
	for i := range batch {
		in := &batch[i]
		ps := m.pooled[in.Seq]
		if ps == nil {
			continue
		}
		if ps.ended {
			return &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf("sequence %d: its input has ended (it sampled); free it", in.Seq)}
		}
		if !m.info.Encoder {
			continue
		}
		if !in.Sample {
			return &engine.InvalidParamError{Param: "sample", Reason: fmt.Sprintf("sequence %d: an encoder's input comes whole, in one input with Sample set", in.Seq)}
		}
		if perProc == nil {
			perProc = map[*proc]int{}
		}
		p := m.seqs[in.Seq].proc
		perProc[p] += len(in.Tokens)
		if perProc[p] > m.stepCap {
			return &engine.InvalidParamError{Param: "batch", Reason: fmt.Sprintf("encoder inputs of %d tokens on one worker exceed the %d one step carries", perProc[p], m.stepCap)}
		}
	}
	return nil
}

// pooledOutput is input in's output from reply r, where it is the k-th
// sampling input: token -1 and the vector.
func (m *Model) pooledOutput(in *engine.StepInput, r *reply, k int) (engine.StepOutput, error) {
	bad := func(format string, a ...any) (engine.StepOutput, error) {
		return engine.StepOutput{}, &WorkerError{Code: retry.CodeInternal, Message: fmt.Sprintf("sequence %d: ", in.Seq) + fmt.Sprintf(format, a...)}
	}
	if k >= len(r.Tokens) || k >= len(r.Embeddings) || r.Embeddings[k] == nil {
		return bad("step reply has no embedding for it")
	}
	vec, err := decodeVector(*r.Embeddings[k], m.info.EmbedDim)
	if err != nil {
		return bad("%v", err)
	}
	if ps := m.pooled[in.Seq]; ps != nil { // nil: freed while its step was out
		ps.ended = true
	}
	return engine.StepOutput{Seq: in.Seq, Token: -1, Embedding: vec}, nil
}

// decodeVector reads a vector as the protocol carries it: base64 of dim
// little-endian float32 values, every one finite.
func decodeVector(s string, dim int) ([]float32, error) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("embedding is not base64: %w", err)
	}
	if len(raw) != 4*dim {
		return nil, fmt.Errorf("embedding of %d bytes, want %d float32 values", len(raw), dim)
	}
	vec := make([]float32, dim)
	for i := range vec {
		v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("embedding value %d is %v", i, v)
		}
		vec[i] = v
	}
	return vec, nil
}

// embedInfo fills what the model says about its embeddings: the workers'
// embed_dim and encoder flag, and the checkpoint's pooling
// (engine.ReadPooling), whose error refuses the load.
func (m *Model) embedInfo(w *wireInfo) error {
	if w.EmbedDim <= 0 {
		if w.Encoder {
			return &WorkerError{Code: retry.CodeInternal, Message: "an encoder without embed_dim"}
		}
		return nil
	}
	pc, err := engine.ReadPooling(m.spec.Path, w.Encoder)
	if err != nil {
		return err
	}
	m.info.EmbedDim, m.info.Encoder = w.EmbedDim, w.Encoder
	m.info.Pooling, m.info.Normalize = pc.Pooling, pc.Normalize
	m.info.Matryoshka, m.info.MatryoshkaDims = pc.Matryoshka, pc.MatryoshkaDims
	if w.Encoder && pc.MaxLength > 0 {
		// An encoder's positions end at max_seq_length in training (BERT's
		// position table may be longer): inputs past it are refused.
		m.info.ContextLength = min(m.info.ContextLength, pc.MaxLength)
	}
	m.stepCap = w.StepTokens
	return nil
}
