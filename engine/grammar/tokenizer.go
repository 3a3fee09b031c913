package grammar

import (
	"slices"

	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

// VocabFromTokenizer prepares tok's vocabulary: every id's decoded bytes,
// special tokens excluded, tok's EOS tokens and eos as the end, tok as
// the Encoder of Matcher.ForcedTokens. size is the model's vocabulary
// size when it differs from the tokenizer's (an embedding padded past the
// last token: the extra ids decode to no bytes and are never allowed); 0
// takes tok.VocabSize().
func VocabFromTokenizer(tok *tokenizer.Tokenizer, size int, eos ...int32) *Vocab {
	if size <= 0 {
		size = tok.VocabSize()
	}
	pieces := make([][]byte, size)
	for id := range pieces {
		pieces[id] = tok.TokenBytes(int32(id))
	}
	v := NewVocab(pieces, slices.Concat(tok.EOS(), eos), tok.IsSpecial)
	v.SetEncoder(tok)
	return v
}
