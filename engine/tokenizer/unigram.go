package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"
)

// unkPenalty is how much lower than the lowest vocabulary score an
// unknown character scores (SentencePiece's kUnkPenalty).
const unkPenalty = 10.0

// unigramModel is a SentencePiece unigram model: each word becomes the
// segmentation into vocabulary pieces with the highest total score
// (Viterbi over the pieces that start at each character), characters no
// piece covers scoring as the unknown token. It follows Hugging Face's
// Unigram::encode_optimized: a best path per end position, ties kept by
// the first (leftmost-starting) candidate, runs of unknown characters
// fused into one unknown token, which with byte_fallback becomes the
// <0xXX> tokens of its bytes instead.
type unigramModel struct {
	ids          map[string]int32 // piece -> id (the last of duplicate pieces, as Hugging Face)
	scores       []float64        // by id
	unk          int32
	unkScore     float64
	byteFallback bool
	byteTokens   [256]int32 // <0xXX> ids; -1 missing
	trie         *byteTrie
	cache        *wordCache
}

type unigramSpec struct {
	Vocab        [][2]json.RawMessage `json:"vocab"`
	UnkID        *int                 `json:"unk_id"`
	ByteFallback bool                 `json:"byte_fallback"`
}

func (t *Tokenizer) buildUnigram(raw json.RawMessage) error {
	var ms unigramSpec
	if err := json.Unmarshal(raw, &ms); err != nil {
		return specErr("model", ErrMalformed, "%v", err)
	}
	if len(ms.Vocab) == 0 {
		return specErr("model.vocab", ErrMalformed, "missing or empty")
	}
	if len(ms.Vocab) > maxTokenID {
		return specErr("model.vocab", ErrMalformed, "%d pieces: more than %d", len(ms.Vocab), maxTokenID)
	}
	if ms.UnkID == nil || *ms.UnkID < 0 || *ms.UnkID >= len(ms.Vocab) {
		// Hugging Face fails at encode time on the first unknown character
		// without one; a tokenizer that cannot encode any text is refused.
		return specErr("model.unk_id", ErrMalformed, "missing or outside the vocabulary")
	}
	m := &unigramModel{
		ids: make(map[string]int32, len(ms.Vocab)), scores: make([]float64, len(ms.Vocab)),
		unk: int32(*ms.UnkID), byteFallback: ms.ByteFallback, cache: newWordCache(),
	}
	t.tokens = make(map[string]int32, len(ms.Vocab))
	minScore := math.Inf(1)
	for i, entry := range ms.Vocab {
		var piece string
		var score float64
		if json.Unmarshal(entry[0], &piece) != nil || json.Unmarshal(entry[1], &score) != nil {
			return specErr(fmt.Sprintf("model.vocab[%d]", i), ErrMalformed, "not a [piece, score] pair")
		}
		m.ids[piece] = int32(i)
		t.tokens[piece] = int32(i)
		m.scores[i] = score
		minScore = min(minScore, score)
	}
	m.trie = newByteTrie(m.ids)
	m.unkScore = minScore - unkPenalty
	for b := range m.byteTokens {
		m.byteTokens[b] = -1
		if id, ok := m.ids[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteTokens[b] = id
		}
	}
	t.vocabSize = len(ms.Vocab)
	t.words = m
	return nil
}

// bestEnd is the best path found so far ending at one byte position.
type bestEnd struct {
	score float64
	start int32 // -1: no path yet
	id    int32
}

func (m *unigramModel) encodeWord(dst []int32, word string) []int32 {
	if word == "" {
		return dst
	}
	if len(word) <= maxCachedWord {
		if ids, ok := m.cache.get(word); ok {
			return append(dst, ids...)
		}
	}
	n := len(dst)
	dst = m.viterbi(dst, word)
	if len(word) <= maxCachedWord {
		m.cache.put(word, append([]int32(nil), dst[n:]...))
	}
	return dst
}

func (m *unigramModel) viterbi(dst []int32, word string) []int32 {
	best := make([]bestEnd, len(word)+1)
	for i := range best {
		best[i].start = -1
	}
	best[0].start = 0
	for start := 0; start < len(word); {
		_, mblen := utf8.DecodeRuneInString(word[start:])
		till := best[start].score
		single := false
		// Pieces starting here, shortest first. Pieces are valid UTF-8,
		// so every match ends on a character boundary.
		for n, end := int32(0), start; end < len(word); {
			if n = m.trie.step(n, word[end]); n < 0 {
				break
			}
			end++
			if id := m.trie.val[n]; id >= 0 {
				m.relax(best, start, end, id, m.scores[id]+till)
				single = single || end-start == mblen
			}
		}
		if !single {
			m.relax(best, start, start+mblen, m.unk, m.unkScore+till)
		}
		start += mblen
	}
	// Walk back from the end, fusing runs of unknown pieces.
	var rev []int32
	var unkEnd int // end of the pending run of unknown characters; 0 if none
	flush := func(start int) {
		if unkEnd > 0 {
			rev = m.appendUnknown(rev, word[start:unkEnd])
			unkEnd = 0
		}
	}
	end := len(word)
	for end > 0 {
		node := best[end]
		start := int(node.start)
		if node.id == m.unk {
			if unkEnd == 0 {
				unkEnd = end
			}
		} else {
			flush(end)
			rev = append(rev, m.ids[word[start:end]])
		}
		end = start
	}
	flush(0)
	for i := len(rev) - 1; i >= 0; i-- {
		dst = append(dst, rev[i])
	}
	return dst
}

func (m *unigramModel) relax(best []bestEnd, start, end int, id int32, score float64) {
	if best[end].start < 0 || score > best[end].score {
		best[end] = bestEnd{score: score, start: int32(start), id: id}
	}
}

// appendUnknown appends (in reverse, as the walk back collects) the ids
// of a fused run of unknown text: its byte tokens with byte_fallback when
// all exist, else the unknown token.
func (m *unigramModel) appendUnknown(rev []int32, text string) []int32 {
	if id, ok := m.ids[text]; ok {
		return append(rev, id)
	}
	if m.byteFallback {
		all := true
		for i := 0; i < len(text); i++ {
			all = all && m.byteTokens[text[i]] >= 0
		}
		if all {
			for i := len(text) - 1; i >= 0; i-- {
				rev = append(rev, m.byteTokens[text[i]])
			}
			return rev
		}
	}
	return append(rev, m.unk)
}
