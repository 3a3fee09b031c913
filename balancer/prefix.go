package balancer

import (
	"hash/maphash"
	"sync"

	"github.com/mlxserving/mlxserving/internal/lru"
)

// prefixChunk is the length in bytes of the text chunks the approximate
// prefix index hashes (llm-d's approximate prefix scorer uses 64
// characters).
const prefixChunk = 64

// prefixIndex is an approximate record of which prompt prefixes a backend
// has seen, and so probably holds in its prefix cache: the chained hashes
// of a prompt's 64-byte chunks, each depending on everything before it,
// kept in an LRU of a bounded number of chunks. It is approximate on
// purpose: the backend evicts on its own, and the index only has to be
// right often enough to route shared prefixes to the same place.
type prefixIndex struct {
	mu   sync.Mutex
	seen *lru.LRU[uint64, struct{}] // each chunk of weight 1
}

func newPrefixIndex(chunks int) *prefixIndex {
	return &prefixIndex{seen: lru.New[uint64, struct{}](int64(max(chunks, 1)), 0, nil)}
}

// chunkHashes returns the chained hashes of text's whole chunks.
func chunkHashes(seed maphash.Seed, text string) []uint64 {
	n := len(text) / prefixChunk
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	var prev uint64
	for i := range n {
		var h maphash.Hash
		h.SetSeed(seed)
		var b [8]byte
		for j := range 8 {
			b[j] = byte(prev >> (8 * j))
		}
		h.Write(b[:])
		h.WriteString(text[i*prefixChunk : (i+1)*prefixChunk])
		prev = h.Sum64()
		out[i] = prev
	}
	return out
}

// match returns the fraction of hashes (a prompt's chunks, in order) whose
// leading run the index holds.
func (p *prefixIndex) match(hashes []uint64) float64 {
	if len(hashes) == 0 {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, h := range hashes {
		if !p.seen.Contains(h) {
			break
		}
		n++
	}
	return float64(n) / float64(len(hashes))
}

// add records that the backend has seen the chunks.
func (p *prefixIndex) add(hashes []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range hashes {
		p.seen.Add(h, struct{}{}, 1)
	}
}
