package tokenizer

import "fmt"

// EncodePair encodes two texts as one input, the way cross-encoders
// (rerankers) and sentence-pair classifiers take them, and returns the
// token type id of every token as well. Each text is encoded as by Encode;
// with addSpecial they are joined by the post-processor's pair form
// (BERT: [CLS] a [SEP] b [SEP], the second text and its [SEP] with type
// id 1; RoBERTa: <s> a </s></s> b </s>, all type 0; TemplateProcessing:
// its "pair" template). Without addSpecial the two are concatenated, a
// with type 0 and b with type 1. A tokenizer whose post-processor has no
// pair form gives an error wrapping ErrUnsupported for addSpecial.
func (t *Tokenizer) EncodePair(a, b string, addSpecial bool) (ids, typeIDs []int32, err error) {
	if addSpecial && t.post.pair == nil {
		return nil, nil, fmt.Errorf("tokenizer: the post-processor has no pair form: %w", ErrUnsupported)
	}
	seqs := [2][]int32{}
	for i, text := range [2]string{a, b} {
		if seqs[i], err = t.Encode(text, false); err != nil {
			return nil, nil, err
		}
	}
	if !addSpecial {
		ids = append(append(make([]int32, 0, len(seqs[0])+len(seqs[1])), seqs[0]...), seqs[1]...)
		typeIDs = make([]int32, len(ids))
		for i := len(seqs[0]); i < len(ids); i++ {
			typeIDs[i] = 1
		}
		return ids, typeIDs, nil
	}
	n := len(seqs[0]) + len(seqs[1])
	for _, it := range t.post.pair {
		n += len(it.ids)
	}
	ids, typeIDs = make([]int32, 0, n), make([]int32, 0, n)
	for _, it := range t.post.pair {
		part := it.ids
		if it.seq >= 0 {
			part = seqs[it.seq]
		}
		ids = append(ids, part...)
		for range part {
			typeIDs = append(typeIDs, it.typeID)
		}
	}
	return ids, typeIDs, nil
}

// EncodeTruncated is Encode with the post-processor's (or BOS/EOS)
// special tokens, keeping at most maxTokens ids in all: when the text is
// longer, its own ids are cut at the end before the special tokens are
// added, as Hugging Face's right truncation does (so a BERT input still
// ends with [SEP]). truncated reports a cut. A maxTokens that leaves no
// room beside the special tokens gives an error wrapping ErrTooShort.
func (t *Tokenizer) EncodeTruncated(text string, maxTokens int) (ids []int32, truncated bool, err error) {
	prefix, suffix := t.specialPrefix(), t.specialSuffix()
	room := maxTokens - len(prefix) - len(suffix)
	if room < 1 {
		return nil, false, fmt.Errorf("tokenizer: %d tokens leave no room beside %d special tokens: %w", maxTokens, len(prefix)+len(suffix), ErrTooShort)
	}
	body, err := t.Encode(text, false)
	if err != nil {
		return nil, false, err
	}
	if len(body) > room {
		body, truncated = body[:room], true
	}
	ids = make([]int32, 0, len(prefix)+len(body)+len(suffix))
	ids = append(append(append(ids, prefix...), body...), suffix...)
	return ids, truncated, nil
}
