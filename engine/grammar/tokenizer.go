package grammar

import "github.com/mlxserving/mlxserving/engine/tokenizer"

// VocabFromTokenizer prepares tok's vocabulary: every id's decoded bytes,
// special tokens excluded, tok's EOS tokens as the end, tok as the
// Encoder of Matcher.ForcedTokens.
func VocabFromTokenizer(tok *tokenizer.Tokenizer) *Vocab {
	pieces := make([][]byte, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.TokenBytes(int32(id))
	}
	v := NewVocab(pieces, tok.EOS(), tok.IsSpecial)
	v.SetEncoder(tok)
	return v
}
