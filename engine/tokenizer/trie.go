package tokenizer

import "sort"

// byteTrie maps byte strings to token ids. It is built once and then
// stored flat: node n's children are labels[first[n]:first[n+1]] (sorted)
// with nodes child[...], so walking a word costs one short search per
// byte instead of hashing every candidate substring.
type byteTrie struct {
	first  []int32 // per node, index of its first edge; one extra entry at the end
	labels []byte
	child  []int32
	val    []int32 // per node, the id of the token ending there, or -1
}

// newByteTrie builds the trie of keys (key -> id): the keys are sorted,
// then nodes are laid out breadth first, each node's children (the
// distinct next bytes of its range of keys) appended together.
func newByteTrie(keys map[string]int32) *byteTrie {
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	type span struct{ lo, hi, depth int32 } // keys [lo, hi) share a prefix of depth bytes
	queue := []span{{0, int32(len(sorted)), 0}}
	t := &byteTrie{}
	for n := 0; n < len(queue); n++ {
		sp := queue[n]
		lo, depth := sp.lo, int(sp.depth)
		t.val = append(t.val, -1)
		if lo < sp.hi && len(sorted[lo]) == depth {
			t.val[n] = keys[sorted[lo]]
			lo++
		}
		t.first = append(t.first, int32(len(t.labels)))
		for lo < sp.hi {
			b := sorted[lo][depth]
			hi := lo + 1
			for hi < sp.hi && sorted[hi][depth] == b {
				hi++
			}
			t.labels = append(t.labels, b)
			t.child = append(t.child, int32(len(queue)))
			queue = append(queue, span{lo, hi, sp.depth + 1})
			lo = hi
		}
	}
	t.first = append(t.first, int32(len(t.labels)))
	return t
}

// step follows the edge labelled b from node n; -1 when there is none.
func (t *byteTrie) step(n int32, b byte) int32 {
	lo, hi := t.first[n], t.first[n+1]
	for hi-lo > 8 {
		mid := int32(uint32(lo+hi) >> 1)
		if t.labels[mid] < b {
			lo = mid + 1
		} else {
			hi = mid + 1 // keep mid: it may be b
		}
	}
	for i := lo; i < hi; i++ {
		if t.labels[i] == b {
			return t.child[i]
		}
	}
	return -1
}
