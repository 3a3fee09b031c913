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

// newByteTrie builds the trie of keys (key -> id).
func newByteTrie(keys map[string]int32) *byteTrie {
	type node struct {
		kids map[byte]int32
		val  int32
	}
	nodes := []node{{val: -1}}
	for k, id := range keys {
		n := int32(0)
		for i := 0; i < len(k); i++ {
			c, ok := nodes[n].kids[k[i]]
			if !ok {
				c = int32(len(nodes))
				nodes = append(nodes, node{val: -1})
				if nodes[n].kids == nil {
					nodes[n].kids = map[byte]int32{}
				}
				nodes[n].kids[k[i]] = c
			}
			n = c
		}
		nodes[n].val = id
	}
	t := &byteTrie{first: make([]int32, len(nodes)+1), val: make([]int32, len(nodes))}
	var order []byte
	for i, nd := range nodes {
		t.first[i] = int32(len(t.labels))
		t.val[i] = nd.val
		order = order[:0]
		for b := range nd.kids {
			order = append(order, b)
		}
		sort.Slice(order, func(a, b int) bool { return order[a] < order[b] })
		for _, b := range order {
			t.labels = append(t.labels, b)
			t.child = append(t.child, nd.kids[b])
		}
	}
	t.first[len(nodes)] = int32(len(t.labels))
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
