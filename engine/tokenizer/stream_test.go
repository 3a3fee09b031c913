package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// streamAll feeds ids one by one and returns the deltas, whether a stop
// string was hit, and the concatenated text (Flush included).
func streamAll(t testing.TB, tok *Tokenizer, prompt, ids []int32, stops []string) ([]string, bool, string) {
	t.Helper()
	d := tok.NewStreamDecoder(prompt, stops)
	var deltas []string
	var sb strings.Builder
	stopped := false
	for _, id := range ids {
		delta, s := d.Add(id)
		if !utf8.ValidString(delta) {
			t.Fatalf("delta %q is not valid UTF-8", delta)
		}
		if stopped && (delta != "" || !s) {
			t.Fatalf("Add after stop returned %q, %v", delta, s)
		}
		deltas = append(deltas, delta)
		sb.WriteString(delta)
		stopped = stopped || s
	}
	rest := d.Flush()
	if stopped && rest != "" {
		t.Fatalf("Flush after stop returned %q", rest)
	}
	sb.WriteString(rest)
	return deltas, stopped, sb.String()
}

// TestStreamMatchesDecode checks, for every real tokenizer and corpus
// entry, that the streamed deltas add up to the full decode.
func TestStreamMatchesDecode(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range realTokenizers {
		t.Run(name, func(t *testing.T) {
			tok := realTokenizer(t, name)
			for key, text := range corpus {
				ids, err := tok.Encode(text, true)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := tok.Decode(ids, true)
				if _, _, got := streamAll(t, tok, nil, ids, nil); got != want {
					t.Errorf("%s: streamed %q, decoded %q", key, got, want)
				}
			}
		})
	}
}

// TestStreamStopStrings checks stop strings that span tokens, that
// nothing after a stop is emitted, and that held-back text that turns out
// not to be a stop is released.
func TestStreamStopStrings(t *testing.T) {
	for _, name := range []string{"llama3", "llama2"} {
		tok := realTokenizer(t, name)
		cases := []struct {
			text  string
			stops []string
			want  string
			stop  bool
		}{
			{"Hello world. The answer is 42.\nUser: more text", []string{"\nUser:"}, "Hello world. The answer is 42.", true},
			{"abcdefghij", []string{"def", "cd"}, "ab", true},
			{"no stop here, STOPPED almost: STO", []string{"STOP!"}, "no stop here, STOPPED almost: STO", false},
			{"emoji 🍕🍕 then 日本語 end", []string{"🍕🍕"}, "emoji ", true},
			{"split 日本語 end", []string{"本"}, "split 日", true},
			{"stop at the very end", []string{"end"}, "stop at the very ", true},
			{"stopfirst", []string{"stop"}, "", true},
		}
		for _, c := range cases {
			ids, _ := tok.Encode(c.text, false)
			_, stopped, got := streamAll(t, tok, nil, ids, c.stops)
			if got != c.want || stopped != c.stop {
				t.Errorf("%s: %q stops %q: got %q, %v; want %q, %v", name, c.text, c.stops, got, stopped, c.want, c.stop)
			}
		}
	}
}

// TestStreamHoldsPartialUTF8 feeds the bytes of one emoji as separate
// byte tokens: nothing comes out until the character completes.
func TestStreamHoldsPartialUTF8(t *testing.T) {
	tok := realTokenizer(t, "llama2") // byte_fallback tokens <0xF0> ...
	var ids []int32
	for _, b := range []byte("🍕") {
		tid, ok := tok.TokenID(byteTokenName(b))
		if !ok {
			t.Fatalf("no byte token for %#x", b)
		}
		ids = append(ids, tid)
	}
	d := tok.NewStreamDecoder(nil, nil)
	for i, id := range ids {
		delta, _ := d.Add(id)
		if i < len(ids)-1 && delta != "" {
			t.Fatalf("byte %d released %q before the character completed", i, delta)
		}
		if i == len(ids)-1 && delta != "🍕" {
			t.Fatalf("last byte released %q, want the emoji", delta)
		}
	}
	// A dangling lead byte becomes U+FFFD at Flush.
	d = tok.NewStreamDecoder(nil, nil)
	if delta, _ := d.Add(ids[0]); delta != "" {
		t.Fatalf("lead byte released %q", delta)
	}
	if rest := d.Flush(); rest != "\uFFFD" {
		t.Fatalf("Flush = %q, want U+FFFD", rest)
	}
}

func byteTokenName(b byte) string {
	const hex = "0123456789ABCDEF"
	return "<0x" + string(hex[b>>4]) + string(hex[b&15]) + ">"
}

// TestStreamSentencePieceSpace checks SentencePiece leading-space handling:
// the first word of the output loses its space, a word after prompt text
// keeps it, and special tokens produce no text.
func TestStreamSentencePieceSpace(t *testing.T) {
	tok := realTokenizer(t, "llama2")
	bos, _ := tok.BOS()
	hello, _ := tok.Encode("Hello world", false) // ▁Hello ▁world
	_, _, got := streamAll(t, tok, nil, hello, nil)
	if got != "Hello world" {
		t.Errorf("no prompt: %q", got)
	}
	_, _, got = streamAll(t, tok, []int32{bos}, hello, nil)
	if got != "Hello world" {
		t.Errorf("prompt [BOS]: %q", got)
	}
	prompt, _ := tok.Encode("[INST] hi [/INST]", true)
	full, _ := tok.Decode(append(append([]int32{}, prompt...), hello...), true)
	head, _ := tok.Decode(prompt, true)
	_, _, got = streamAll(t, tok, prompt, append(hello, tok.EOS()...), nil)
	if got != " Hello world" || got != full[len(head):] {
		t.Errorf("after prompt: %q; full decode adds %q", got, full[len(head):])
	}
}
