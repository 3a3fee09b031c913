package tokenizer

import "testing"

// BenchmarkLoad measures Load of each real tokenizer (tokenizer.json
// parsing, vocabulary and merge tables, template compilation).
func BenchmarkLoad(b *testing.B) {
	for _, name := range realTokenizers {
		b.Run(name, func(b *testing.B) {
			dir := tokenizerDir(b, name)
			for b.Loop() {
				if _, err := Load(dir); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
