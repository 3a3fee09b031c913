package grammar

import (
	"bytes"
	"sort"
	"sync"

	"github.com/mlxserving/mlxserving/internal/lru"
)

// Vocab is a model vocabulary prepared for matching: the bytes of every
// token in a trie, and the tokens that may appear whole inside a JSON
// string grouped by length. Build one per tokenizer and share it; it is
// immutable and safe for concurrent use, and caches the grammars compiled
// against it.
type Vocab struct {
	size   int
	words  int // 64-bit words in a mask
	pieces [][]byte
	eos    []int32
	all    trie // every token that produces bytes and is not special
	digs   digitToks
	root   *strInfo
	// insideLE[r] holds the tokens that, read inside a string, stay
	// inside it and need at most r characters of its budget.
	insideLE [][]uint64
	infos    sync.Map // trie node of all -> *strInfo, built on first use
	// quoteWarm builds the infos of nodes after a quote on the first
	// Compile (warm.go).
	quoteWarm sync.Once

	cache *lru.Shared[string, *Grammar]
	// regexes holds the patterns compiled against this vocabulary, by
	// text, so that schemas sharing a format or pattern share its DFA
	// states and their token sets (see warm.go).
	regexes *lru.Shared[string, *regex]
	enc     Encoder // for ForcedTokens; nil: nothing is forced
	// loops is built on the first Matcher.Loop (loop.go).
	loops struct {
		once sync.Once
		set  *loopSet
	}
	// plain is built on the first budget-restricted mask (budget.go).
	plain struct {
		once sync.Once
		set  []uint64
	}
}

// NewVocab prepares a vocabulary. pieces[id] are the bytes token id
// decodes to; special reports tokens that never appear in generated JSON
// (chat markers, BOS); eos are the tokens that end generation. Tokens that
// decode to no bytes are never allowed.
func NewVocab(pieces [][]byte, eos []int32, special func(id int32) bool) *Vocab {
	v := &Vocab{size: len(pieces), words: (len(pieces) + 63) / 64, pieces: pieces}
	for _, e := range eos {
		if e >= 0 && int(e) < len(pieces) {
			v.eos = append(v.eos, e)
		}
	}
	var allIDs []int32
	for id, p := range pieces {
		if len(p) == 0 || (special != nil && special(int32(id))) || isEOS(v.eos, int32(id)) {
			continue
		}
		allIDs = append(allIDs, int32(id))
	}
	v.all = buildTrie(pieces, allIDs)
	v.root = buildStrInfo(&v.all, pieces, 0, 0)
	v.digs = buildDigitToks(&v.all, pieces)
	maxNeed := 0
	if n := len(v.root.insideNeed); n > 0 {
		maxNeed = int(v.root.insideNeed[n-1])
	}
	v.insideLE = make([][]uint64, maxNeed+1)
	cur := make([]uint64, v.words)
	k := 0
	for r := 0; r <= maxNeed; r++ {
		for ; k < len(v.root.insideNeed) && int(v.root.insideNeed[k]) <= r; k++ {
			id := v.root.insideID[k]
			cur[id>>6] |= 1 << (id & 63)
		}
		v.insideLE[r] = append([]uint64(nil), cur...)
	}
	v.root.insideID, v.root.insideNeed = nil, nil
	v.cache = lru.NewShared[string, *Grammar](256)
	v.regexes = lru.NewShared[string, *regex](maxRegexes)
	return v
}

func isEOS(eos []int32, id int32) bool {
	for _, e := range eos {
		if e == id {
			return true
		}
	}
	return false
}

// info returns the string classification of the tokens below node, at
// depth bytes, building it on first use.
func (v *Vocab) info(node int32, depth int) *strInfo {
	if si, ok := v.infos.Load(node); ok {
		return si.(*strInfo)
	}
	si, _ := v.infos.LoadOrStore(node, buildStrInfo(&v.all, v.pieces, node, depth))
	return si.(*strInfo)
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return v.size }

// MaskWords is the length in 64-bit words of a mask over the vocabulary.
func (v *Vocab) MaskWords() int { return v.words }

// trie is a byte trie over token pieces in preorder, in flat arrays.
type trie struct {
	edgeStart []int32 // node -> first edge; edges of node are edgeStart[n]:edgeStart[n+1]
	edgeByte  []byte
	edgeNode  []int32
	tokStart  []int32 // node -> first token; tokens of node are tokStart[n]:tokStart[n+1]
	toks      []int32
}

func buildTrie(pieces [][]byte, ids []int32) trie {
	sort.Slice(ids, func(a, b int) bool {
		if c := bytes.Compare(pieces[ids[a]], pieces[ids[b]]); c != 0 {
			return c < 0
		}
		return ids[a] < ids[b]
	})
	var t trie
	// Sorted keys give nodes in preorder; build with an explicit path.
	t.edgeStart = []int32{0}
	t.tokStart = []int32{0}
	nodes := 1
	parent := []int32{-1}
	pbyte := []byte{0}
	path := []int32{0} // path[d] is the node at depth d for the current key
	var prev []byte
	tokNode := make([]int32, 0, len(ids))
	for _, id := range ids {
		p := pieces[id]
		common := 0
		for common < len(p) && common < len(prev) && p[common] == prev[common] {
			common++
		}
		path = path[:common+1]
		for d := common; d < len(p); d++ {
			parent = append(parent, path[d])
			pbyte = append(pbyte, p[d])
			path = append(path, int32(nodes))
			nodes++
		}
		tokNode = append(tokNode, path[len(p)])
		prev = p
	}
	// Edges: children of each node are created in increasing byte order
	// and in increasing node order, so a counting pass lays them out.
	count := make([]int32, nodes+1)
	for n := 1; n < nodes; n++ {
		count[parent[n]+1]++
	}
	t.edgeStart = make([]int32, nodes+1)
	for n := 0; n < nodes; n++ {
		t.edgeStart[n+1] = t.edgeStart[n] + count[n+1]
	}
	fill := append([]int32(nil), t.edgeStart[:nodes]...)
	t.edgeByte = make([]byte, nodes-1)
	t.edgeNode = make([]int32, nodes-1)
	for n := 1; n < nodes; n++ {
		p := parent[n]
		t.edgeByte[fill[p]] = pbyte[n]
		t.edgeNode[fill[p]] = int32(n)
		fill[p]++
	}
	tc := make([]int32, nodes+1)
	for _, n := range tokNode {
		tc[n+1]++
	}
	t.tokStart = make([]int32, nodes+1)
	for n := 0; n < nodes; n++ {
		t.tokStart[n+1] = t.tokStart[n] + tc[n+1]
	}
	fillT := append([]int32(nil), t.tokStart[:nodes]...)
	t.toks = make([]int32, len(ids))
	for i, n := range tokNode {
		t.toks[fillT[n]] = ids[i]
		fillT[n]++
	}
	return t
}
