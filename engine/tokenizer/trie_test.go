package tokenizer

import (
	"math/rand"
	"testing"
)

// lookup walks the whole key; -1 when it is not a key.
func (t *byteTrie) lookup(key string) int32 {
	n := int32(0)
	for i := 0; i < len(key); i++ {
		if n = t.step(n, key[i]); n < 0 {
			return -1
		}
	}
	return t.val[n]
}

// TestByteTrie: every key is found with its id, and strings that are not
// keys (prefixes, extensions, random ones) are not, over nodes with few
// and with many children (the binary-search path).
func TestByteTrie(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	keys := map[string]int32{"": 99}
	alpha := "abcdefghijklmnopqrstuvwxyz0123456789\x00\xff\xc3\xa9"
	randStr := func() string {
		b := make([]byte, 1+r.Intn(6))
		for i := range b {
			b[i] = alpha[r.Intn(len(alpha))]
		}
		return string(b)
	}
	for len(keys) < 5000 {
		keys[randStr()] = int32(len(keys))
	}
	tr := newByteTrie(keys)
	for k, id := range keys {
		if got := tr.lookup(k); got != id {
			t.Fatalf("lookup(%q) = %d, want %d", k, got, id)
		}
	}
	for range 20000 {
		s := randStr()
		want, ok := keys[s]
		if !ok {
			want = -1
		}
		if got := tr.lookup(s); got != want {
			t.Fatalf("lookup(%q) = %d, want %d", s, got, want)
		}
	}
	if empty := newByteTrie(map[string]int32{}); empty.lookup("a") != -1 || empty.lookup("") != -1 {
		t.Error("empty trie finds keys")
	}
}
