package tokenizer

import (
	"sort"
	"strings"
	"testing"
	"time"
)

// benchCorpus is the fixed multilingual text the benchmarks (and
// testdata/gen/bench.mjs) use: every corpus.json entry in key order,
// joined by newlines, eight times over.
func benchCorpus(t testing.TB) string {
	c := loadCorpus(t)
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for range 8 {
		for _, k := range keys {
			sb.WriteString(c[k])
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}

func BenchmarkEncode(b *testing.B) {
	text := benchCorpus(b)
	for _, name := range realTokenizers {
		b.Run(name, func(b *testing.B) {
			benchEncode(b, realTokenizer(b, name), text)
		})
	}
	// WordPiece: the BERT-style tokenizer of testdata/wordpiece (uncased:
	// clean text, CJK spacing, accent stripping, lowercasing).
	b.Run("wordpiece", func(b *testing.B) {
		benchEncode(b, wordPieceTokenizer(b, "bert_uncased"), text)
	})
	// Unigram: the XLM-RoBERTa-shaped tokenizer of testdata/unigram, and
	// testdata/xlmr with its Precompiled normalizer.
	b.Run("unigram", func(b *testing.B) {
		benchEncode(b, unigramTokenizer(b), text)
	})
	b.Run("xlmr", func(b *testing.B) {
		benchEncode(b, xlmrTokenizer(b), text)
	})
}

func benchEncode(b *testing.B, tok *Tokenizer, text string) {
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := tok.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	text := benchCorpus(b)
	for _, name := range realTokenizers {
		b.Run(name, func(b *testing.B) {
			benchDecode(b, realTokenizer(b, name), text)
		})
	}
	b.Run("wordpiece", func(b *testing.B) {
		benchDecode(b, wordPieceTokenizer(b, "bert_uncased"), text)
	})
	b.Run("unigram", func(b *testing.B) {
		benchDecode(b, unigramTokenizer(b), text)
	})
	b.Run("xlmr", func(b *testing.B) {
		benchDecode(b, xlmrTokenizer(b), text)
	})
}

func benchDecode(b *testing.B, tok *Tokenizer, text string) {
	ids, _ := tok.Encode(text, false)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := tok.Decode(ids, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamAdd measures StreamDecoder.Add per generated token, with
// two stop strings, as the batcher's step loop calls it.
func BenchmarkStreamAdd(b *testing.B) {
	text := benchCorpus(b)
	for _, name := range realTokenizers {
		b.Run(name, func(b *testing.B) {
			tok := realTokenizer(b, name)
			ids, _ := tok.Encode(text, false)
			d := tok.NewStreamDecoder(nil, []string{"<|never|>", "\n\nUser:"})
			i := 0
			for b.Loop() {
				if i == len(ids) {
					d, i = tok.NewStreamDecoder(nil, []string{"<|never|>", "\n\nUser:"}), 0
				}
				d.Add(ids[i])
				i++
			}
		})
	}
}

func BenchmarkChatTemplate(b *testing.B) {
	msgs := []Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "What is the capital of France?"},
		{Role: "assistant", Content: "Paris."},
		{Role: "user", Content: "And of Japan?"},
	}
	for _, name := range []string{"llama3_1", "qwen3"} {
		b.Run(name, func(b *testing.B) {
			tok := realTokenizer(b, name)
			for b.Loop() {
				if _, err := tok.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: true, Now: time.Unix(0, 0)}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
