package tokenizer

import (
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// checkFastSplit compares the hand-written matchers with regexp2 on s.
func checkFastSplit(t *testing.T, s string) {
	t.Helper()
	for _, pattern := range []string{llama3Pattern, qwen2Pattern, gpt2Pattern} {
		fast := fastSplitter(pattern, splitIsolated)
		re := &regexSplit{re: regexp2.MustCompile(pattern, regexp2.Unicode), behavior: splitIsolated}
		want := re.splitRegex(nil, s)
		got := fast(nil, s)
		if !slices.Equal(got, want) {
			t.Fatalf("pattern %.20q on %q:\n fast %q\n  re2 %q", pattern, s, got, want)
		}
	}
}

func TestFastSplitMatchesRegex(t *testing.T) {
	for _, s := range loadCorpus(t) {
		checkFastSplit(t, s)
	}
	for _, s := range []string{"'S 'Ve 'LL 'd 're", "  \n  word", "\t\tx", "a\u00a0\u00a0b", "x \r\n\r\n y", "!!\n\n", " !!\r\n", "1234567", "\u2028\u2029 ", "'ſ 'K"} {
		checkFastSplit(t, s)
	}
}

// FuzzFastSplit: the hand-written matchers agree with regexp2 on any
// valid text.
func FuzzFastSplit(f *testing.F) {
	for _, s := range []string{"Hello, world!", "  \n\t x", "it's 'LL", "١٢٣ 123", "日本 語", "a\u00a0 b", "😀!!\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		checkFastSplit(t, s)
	})
}
