package grammar_test

import (
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/grammar"
)

// A vocabulary of single characters plus EOS; greedy "sampling" picks the
// lowest allowed id, so the document is the smallest one the schema takes.
func ExampleVocab_Compile() {
	pieces := [][]byte{[]byte("<eos>")}
	for c := byte(' '); c <= '~'; c++ {
		pieces = append(pieces, []byte{c})
	}
	v := grammar.NewVocab(pieces, []int32{0}, nil)
	g, err := v.Compile([]byte(`{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`), grammar.Limits{MaxWhitespace: 1})
	if err != nil {
		panic(err)
	}
	m := g.NewMatcher()
	mask := make([]uint64, v.MaskWords())
	var out []byte
	for !m.Done() {
		m.FillMask(mask)
		id := int32(0)
		for !engine.MaskAllows(mask, id) {
			id++
		}
		if err := m.Accept(id); err != nil {
			panic(err)
		}
		out = append(out, pieces[id]...)
	}
	fmt.Println(string(out))

	_, err = v.Compile([]byte(`{"type":"string","format":"idn-email"}`), grammar.Limits{})
	fmt.Println(err)
	// Output:
	// { "ok" : false }
	// unsupported JSON schema keyword "format: idn-email" at #
}
