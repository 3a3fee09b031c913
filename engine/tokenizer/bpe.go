package tokenizer

import (
	"hash/maphash"
	"sync"
	"unicode/utf8"
)

// bpeModel is a BPE vocabulary with merges ranked by priority. Vocabulary
// keys are in working form: raw bytes for byte-level models, the token's
// UTF-8 text otherwise.
type bpeModel struct {
	vocab        map[string]int32
	merges       map[uint64]mergeRule
	unk          int32 // -1 when there is no unknown token
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	byteLevel    bool
	byteTokens   [256]int32 // <0xXX> tokens for byte_fallback; -1 missing
	cache        *wordCache
}

type mergeRule struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// maxCachedWord bounds the words kept in the cache; longer ones are rare
// and would crowd it out.
const maxCachedWord = 64

// encodeWord appends the ids of one pre-tokenized word to dst.
func (m *bpeModel) encodeWord(dst []int32, word string) []int32 {
	if word == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(dst, id)
		}
	}
	if len(word) <= maxCachedWord {
		if ids, ok := m.cache.get(word); ok {
			return append(dst, ids...)
		}
	}
	start := len(dst)
	dst = m.merge(dst, m.symbols(word))
	if len(word) <= maxCachedWord {
		m.cache.put(word, append([]int32(nil), dst[start:]...))
	}
	return dst
}

// symbols splits a word into its initial symbols: bytes for byte-level
// models, characters otherwise (with byte fallback or the unknown token for
// characters missing from the vocabulary).
func (m *bpeModel) symbols(word string) []int32 {
	syms := make([]int32, 0, len(word))
	if m.byteLevel {
		for i := 0; i < len(word); i++ {
			syms = append(syms, m.byteTokens[word[i]])
		}
		return syms
	}
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+size]
		i += size
		if id, ok := m.vocab[ch]; ok {
			syms = append(syms, id)
			continue
		}
		if m.byteFallback && m.hasBytes(ch) {
			for j := 0; j < len(ch); j++ {
				syms = append(syms, m.byteTokens[ch[j]])
			}
			continue
		}
		if m.unk < 0 {
			continue // Hugging Face drops characters it cannot represent
		}
		if m.fuseUnk && len(syms) > 0 && syms[len(syms)-1] == m.unk {
			continue
		}
		syms = append(syms, m.unk)
	}
	return syms
}

func (m *bpeModel) hasBytes(ch string) bool {
	for j := 0; j < len(ch); j++ {
		if m.byteTokens[ch[j]] < 0 {
			return false
		}
	}
	return true
}

// merge applies merges to syms in rank order (leftmost first among equal
// ranks) and appends the resulting ids to dst.
func (m *bpeModel) merge(dst []int32, syms []int32) []int32 {
	n := len(syms)
	if n < 2 {
		return append(dst, syms...)
	}
	if n <= 16 {
		return append(dst, m.mergeSmall(syms)...)
	}
	prev := make([]int32, n)
	next := make([]int32, n)
	for i := range syms {
		prev[i], next[i] = int32(i-1), int32(i+1)
	}
	h := make(mergeHeap, 0, n)
	for i := 0; i+1 < n; i++ {
		if r, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok {
			h = append(h, mergeCand{pos: int32(i), rank: r.rank, id: r.id, left: syms[i], right: syms[i+1]})
		}
	}
	h.init()
	for len(h) > 0 {
		c := h.pop()
		p := c.pos
		nx := next[p]
		if syms[p] != c.left || nx >= int32(n) || syms[nx] != c.right {
			continue // stale: a neighbour merged first
		}
		syms[p] = c.id
		syms[nx] = -2 // removed
		next[p] = next[nx]
		if next[p] < int32(n) {
			prev[next[p]] = p
		}
		if pv := prev[p]; pv >= 0 {
			if r, ok := m.merges[pairKey(syms[pv], syms[p])]; ok {
				h.push(mergeCand{pos: pv, rank: r.rank, id: r.id, left: syms[pv], right: syms[p]})
			}
		}
		if nn := next[p]; nn < int32(n) {
			if r, ok := m.merges[pairKey(syms[p], syms[nn])]; ok {
				h.push(mergeCand{pos: p, rank: r.rank, id: r.id, left: syms[p], right: syms[nn]})
			}
		}
	}
	for i := int32(0); i < int32(n); i = next[i] {
		dst = append(dst, syms[i])
	}
	return dst
}

// mergeSmall is the quadratic merge loop, faster than a heap for the short
// words that make up most text.
func (m *bpeModel) mergeSmall(syms []int32) []int32 {
	for len(syms) > 1 {
		best, bestRank, bestID := -1, int32(0), int32(0)
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := m.merges[pairKey(syms[i], syms[i+1])]; ok && (best < 0 || r.rank < bestRank) {
				best, bestRank, bestID = i, r.rank, r.id
			}
		}
		if best < 0 {
			break
		}
		syms[best] = bestID
		syms = append(syms[:best+1], syms[best+2:]...)
	}
	return syms
}

type mergeCand struct {
	pos, rank, id int32
	left, right   int32
}

// mergeHeap is a binary min-heap of merge candidates by (rank, pos),
// typed to avoid container/heap's interface boxing on the hot path.
type mergeHeap []mergeCand

func (h mergeHeap) less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}

func (h mergeHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *mergeHeap) push(c mergeCand) {
	*h = append(*h, c)
	hh := *h
	for i := len(hh) - 1; i > 0; {
		parent := (i - 1) / 2
		if !hh.less(i, parent) {
			break
		}
		hh[i], hh[parent] = hh[parent], hh[i]
		i = parent
	}
}

func (h *mergeHeap) pop() mergeCand {
	hh := *h
	top := hh[0]
	last := len(hh) - 1
	hh[0] = hh[last]
	*h = hh[:last]
	h.down(0)
	return top
}

func (h mergeHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		small := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			small = r
		}
		if !h.less(small, i) {
			return
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}

// wordCache maps words to their ids. It is sharded to keep lock contention
// low and each shard is emptied when full, which bounds memory without
// LRU bookkeeping on the hot path.
type wordCache struct {
	seed   maphash.Seed
	shards [16]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int32
}

const cacheShardCap = 4096

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int32)
	}
	return c
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)&15]
}

func (c *wordCache) get(w string) ([]int32, bool) {
	s := c.shard(w)
	s.mu.RLock()
	ids, ok := s.m[w]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int32) {
	s := c.shard(w)
	s.mu.Lock()
	if len(s.m) >= cacheShardCap {
		s.m = make(map[string][]int32)
	}
	s.m[w] = ids
	s.mu.Unlock()
}
