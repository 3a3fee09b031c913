package session

import "github.com/mlxserving/mlxserving/internal/mix"

// DefaultBlockSize is the number of tokens per indexed block: vLLM's
// block size, small enough that a shared prefix is found to within 15
// tokens (the engine then reuses the exact longest common prefix).
const DefaultBlockSize = 16

// hashSeed starts every chain: the hash of the empty prefix.
const hashSeed = 0x6a09e667f3bcc908

// Index maps chained hashes of fixed-size token blocks to the saved KV
// entries (by key) that start with them: block i's hash covers tokens
// [0, (i+1)*size), so equal hashes mean equal prefixes (up to 64-bit
// collisions, which cost a cache miss, never a wrong token: the engine
// compares the tokens themselves). A lookup walks the prompt's blocks
// until one is unknown and names the most recently inserted entry holding
// the deepest block found.
//
// An Index is not safe for concurrent use; PrefixCache guards its own.
type Index struct {
	size    int
	nodes   map[uint64]*node
	entries map[string]*entry
	tokens  int
}

// node is one block hash and the entries holding it.
type node struct {
	holders map[string]struct{}
	best    string // the holder inserted last: a lookup's answer
}

// entry is one saved key: its block hashes, in order.
type entry struct {
	hashes []uint64
	tokens int
}

// NewIndex returns an empty index of blocks of size tokens (at least 1).
func NewIndex(size int) *Index {
	return &Index{size: max(size, 1), nodes: map[uint64]*node{}, entries: map[string]*entry{}}
}

// BlockSize returns the index's block size.
func (x *Index) BlockSize() int { return x.size }

// Len returns the number of keys indexed.
func (x *Index) Len() int { return len(x.entries) }

// Tokens returns the tokens held by the indexed keys, counting each
// key's tokens whole (shared prefixes once per key, as engines store
// them).
func (x *Index) Tokens() int { return x.tokens }

// Insert records that key holds tokens whose full blocks hash to hashes
// (from a Hasher), replacing what key held before.
func (x *Index) Insert(key string, hashes []uint64, tokens int) {
	x.Remove(key)
	e := &entry{hashes: hashes, tokens: tokens}
	x.entries[key] = e
	x.tokens += tokens
	for _, h := range hashes {
		n := x.nodes[h]
		if n == nil {
			n = &node{holders: map[string]struct{}{}}
			x.nodes[h] = n
		}
		n.holders[key] = struct{}{}
		n.best = key
	}
}

// Remove forgets key. It reports whether key was indexed.
func (x *Index) Remove(key string) bool {
	e, ok := x.entries[key]
	if !ok {
		return false
	}
	delete(x.entries, key)
	x.tokens -= e.tokens
	for _, h := range e.hashes {
		n := x.nodes[h]
		if n == nil {
			continue
		}
		delete(n.holders, key)
		if len(n.holders) == 0 {
			delete(x.nodes, h)
			continue
		}
		if n.best == key {
			for k := range n.holders {
				n.best = k
				break
			}
		}
	}
	return true
}

// Has reports whether key is indexed.
func (x *Index) Has(key string) bool {
	_, ok := x.entries[key]
	return ok
}

// ChainSeed is the hash a chain of blocks fed to adapter starts from
// (empty: the base model's, hashSeed): sequences of different adapters
// never share KV, so their chains never meet.
func ChainSeed(adapter string) uint64 {
	if adapter == "" {
		return hashSeed
	}
	h := uint64(hashSeed)
	for i := 0; i < len(adapter); i++ {
		h ^= uint64(adapter[i])
		h *= 0x100000001b3
	}
	return mix.Mix64(h ^ 0x94d049bb133111eb)
}

// Lookup returns the key holding the longest run of prompt's leading
// blocks and the tokens those blocks cover; "" and 0 when even the first
// block is unknown.
func (x *Index) Lookup(prompt []int32) (string, int) { return x.LookupAdapter(prompt, "") }

// LookupAdapter is Lookup among the entries saved by sequences of
// adapter (see ChainSeed).
func (x *Index) LookupAdapter(prompt []int32, adapter string) (string, int) {
	h, best, matched := ChainSeed(adapter), "", 0
	for end := x.size; end <= len(prompt); end += x.size {
		h = hashBlock(h, prompt[end-x.size:end])
		n := x.nodes[h]
		if n == nil {
			break
		}
		best, matched = n.best, end
	}
	return best, matched
}

// Match returns how many of prompt's leading tokens, in whole blocks, key
// holds; 0 for an unknown key.
func (x *Index) Match(key string, prompt []int32) int { return x.MatchAdapter(key, prompt, "") }

// MatchAdapter is Match for a prompt fed to adapter: 0 when key was saved
// by another adapter's sequence (or the base's).
func (x *Index) MatchAdapter(key string, prompt []int32, adapter string) int {
	e, ok := x.entries[key]
	if !ok {
		return 0
	}
	h, matched := ChainSeed(adapter), 0
	for i, want := range e.hashes {
		end := (i + 1) * x.size
		if end > len(prompt) {
			break
		}
		h = hashBlock(h, prompt[end-x.size:end])
		if h != want {
			break
		}
		matched = end
	}
	return matched
}

// hashBlock chains one block onto its parent's hash: FNV-1a over the
// 32-bit token ids, finished with the SplitMix64 mixer.
func hashBlock(parent uint64, block []int32) uint64 {
	h := parent
	for _, t := range block {
		h ^= uint64(uint32(t))
		h *= 0x100000001b3
	}
	return mix.Mix64(h)
}

// Hasher hashes a growing token sequence block by block, as it is fed.
// The zero value is not usable; see NewHasher.
type Hasher struct {
	seed    uint64
	size    int
	hashes  []uint64
	pending []int32 // tokens of the unfinished block
	tokens  int
}

// NewHasher returns a hasher for blocks of size tokens.
func NewHasher(size int) *Hasher { return NewAdapterHasher(size, "") }

// NewAdapterHasher returns a hasher for the tokens fed to a sequence of
// adapter (empty: the base), whose chain starts at ChainSeed(adapter).
func NewAdapterHasher(size int, adapter string) *Hasher {
	size = max(size, 1)
	return &Hasher{seed: ChainSeed(adapter), size: size, pending: make([]int32, 0, size)}
}

// Write feeds tokens.
func (h *Hasher) Write(tokens []int32) {
	h.tokens += len(tokens)
	for len(tokens) > 0 {
		n := min(h.size-len(h.pending), len(tokens))
		h.pending = append(h.pending, tokens[:n]...)
		tokens = tokens[n:]
		if len(h.pending) == h.size {
			parent := h.seed
			if len(h.hashes) > 0 {
				parent = h.hashes[len(h.hashes)-1]
			}
			h.hashes = append(h.hashes, hashBlock(parent, h.pending))
			h.pending = h.pending[:0]
		}
	}
}

// Hashes returns the hashes of the full blocks fed so far. The slice is
// the hasher's own; the hasher only appends to it.
func (h *Hasher) Hashes() []uint64 { return h.hashes[:len(h.hashes):len(h.hashes)] }

// Tokens returns the number of tokens fed.
func (h *Hasher) Tokens() int { return h.tokens }
