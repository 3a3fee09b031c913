package testmodel

import (
	"bytes"
	"encoding/json"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Special tokens, in id order after the byte tokens and merges.
var specialTokens = []string{
	"<|begin_of_text|>",
	"<|end_of_text|>",
	"<|start_header_id|>",
	"<|end_header_id|>",
	"<|eot_id|>",
}

// minVocab holds the byte tokens and the special tokens.
const minVocab = 256 + 5

// maxMerges bounds the merges of big vocabularies; the corpus runs out of
// repeated pairs well before that anyway.
const maxMerges = 2000

// chatTemplate is a Llama 3-style template.
const chatTemplate = "{{- bos_token }}" +
	"{%- for message in messages %}" +
	"{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}" +
	"{%- endfor %}" +
	"{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"

// corpus trains the merges: plain English, so common words and spaces
// before them become tokens.
const corpus = `The quick brown fox jumps over the lazy dog. The dog sleeps in the sun
and the fox runs into the forest. There is a river in the forest, and the water
of the river is cold and clear. Hello world! Hello there, how are you today?
I am fine, thank you. What is the time? It is ten past three in the afternoon.
The system answers the user. The user asks the assistant a question and the
assistant gives an answer. A model reads tokens and writes tokens. The server
streams the tokens to the client as soon as they are ready. Numbers: 1 2 3 10 20
100 2024 3.14 42. Once upon a time there was a small town near the sea, and in
the town there lived an old man with his dog. Every morning the old man walked
with the dog along the sea and watched the ships come in. The ships brought
fish and bread and letters from other towns. In the evening the man read the
letters by the fire while the dog slept at his feet. This is the end of the
story, and the beginning of another one. Write a short poem about the moon.
The moon is bright tonight; the stars are out; the night is long and quiet.`

// tokenizer is a byte-level BPE tokenizer (or, with wordPiece set, BERT's
// WordPiece: see wordpiece.go) in Hugging Face's format.
type tokenizer struct {
	vocab   []string // id -> token, bytes and merges
	fillers []string // the words of the ids after the special tokens (fill)
	merges  []string // "left right", by rank
	names   []string // the special tokens: specialTokens or encoderSpecials
	special []int    // ids of names
	bos     int
	eos     []int
	// An encoder's tokenizer wraps every input in [CLS] ... [SEP] and pads
	// with [PAD]; zero for the decoders'.
	cls, sep, pad int
	wordPiece     bool
}

// encoderSpecials are ModernBERT's special tokens, in id order after the
// byte tokens and merges.
var encoderSpecials = []string{"[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"}

// buildTokenizer trains merges on the corpus until the vocabulary (bytes,
// merges, special tokens) would exceed vocabSize or the corpus has no
// repeated pair left. names are the special tokens after them:
// specialTokens, or encoderSpecials for ModernBERT.
func buildTokenizer(vocabSize int, names []string) *tokenizer {
	t := &tokenizer{names: names}
	enc := byteEncoder()
	ids := map[string]int{}
	for b := 0; b < 256; b++ {
		s := string(enc[b])
		ids[s] = len(t.vocab)
		t.vocab = append(t.vocab, s)
	}
	budget := min(vocabSize-256-len(names), maxMerges)
	for _, m := range trainMerges(enc, budget) {
		t.merges = append(t.merges, m[0]+" "+m[1])
		if _, ok := ids[m[0]+m[1]]; !ok {
			ids[m[0]+m[1]] = len(t.vocab)
			t.vocab = append(t.vocab, m[0]+m[1])
		}
	}
	for i := range names {
		t.special = append(t.special, len(t.vocab)+i)
	}
	if len(names) == len(encoderSpecials) && names[0] == encoderSpecials[0] {
		t.cls, t.sep, t.pad = t.special[1], t.special[2], t.special[3]
		t.bos, t.eos = t.cls, []int{t.sep}
		return t
	}
	t.bos = t.special[0]
	t.eos = []int{t.special[1], t.special[4]}
	t.fill(vocabSize, ids)
	return t
}

// fill gives every id past the special tokens, up to vocabSize, a word of
// its own (a space and two or more syllables, never a token the merges
// made), as a real vocabulary has no id that decodes to nothing. The
// corpus yields a few thousand tokens at most, so a 128,256-id model with
// random weights would otherwise sample ids with no text almost always,
// and a stream of them shows a client nothing: benchmarks could not time
// a first token. Encoding never produces these (no merge leads to them).
func (t *tokenizer) fill(vocabSize int, ids map[string]int) {
	const consonants, vowels = "bdfgklmnprstvz", "aeiou"
	space := string(byteEncoder()[' '])
	for id := t.special[len(t.special)-1] + 1; id < vocabSize; id++ {
		w := []byte(space)
		for n := id; len(w) < 5 || n > 0; n /= len(consonants) * len(vowels) {
			k := n % (len(consonants) * len(vowels))
			w = append(w, consonants[k/len(vowels)], vowels[k%len(vowels)])
		}
		for {
			if _, taken := ids[string(w)]; !taken {
				break
			}
			w = append(w, 'x')
		}
		ids[string(w)] = id
		t.fillers = append(t.fillers, string(w))
	}
}

// byteEncoder is GPT-2's bytes_to_unicode: printable bytes map to
// themselves, the rest to code points from 256 up.
func byteEncoder() [256]rune {
	var enc [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			enc[b] = rune(b)
		} else {
			enc[b] = rune(256 + n)
			n++
		}
	}
	return enc
}

var pretokenRE = regexp.MustCompile(`'s|'t|'re|'ve|'m|'ll|'d| ?\pL+| ?\pN+| ?[^\s\pL\pN]+|\s+`)

// trainMerges runs byte-pair-encoding training over the corpus. Ties break
// on the pair's text, so the result is the same on every run.
func trainMerges(enc [256]rune, budget int) [][2]string {
	type word struct {
		syms []string
		freq int
	}
	freq := map[string]int{}
	for _, w := range pretokenRE.FindAllString(strings.ReplaceAll(corpus, "\n", " "), -1) {
		freq[w]++
	}
	keys := make([]string, 0, len(freq))
	for w := range freq {
		keys = append(keys, w)
	}
	sort.Strings(keys)
	words := make([]word, 0, len(keys))
	for _, w := range keys {
		var syms []string
		for _, b := range []byte(w) {
			syms = append(syms, string(enc[b]))
		}
		words = append(words, word{syms, freq[w]})
	}
	var merges [][2]string
	for len(merges) < budget {
		counts := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				counts[[2]string{w.syms[i], w.syms[i+1]}] += w.freq
			}
		}
		best, bestN := [2]string{}, 1
		for p, n := range counts {
			if n > bestN || (n == bestN && n > 1 && p[0]+" "+p[1] < best[0]+" "+best[1]) {
				best, bestN = p, n
			}
		}
		if bestN < 2 {
			break
		}
		merges = append(merges, best)
		for i := range words {
			words[i].syms = mergePair(words[i].syms, best)
		}
	}
	return merges
}

func mergePair(syms []string, p [2]string) []string {
	out := syms[:0]
	for i := 0; i < len(syms); i++ {
		if i+1 < len(syms) && syms[i] == p[0] && syms[i+1] == p[1] {
			out = append(out, p[0]+p[1])
			i++
			continue
		}
		out = append(out, syms[i])
	}
	return out
}

// json is tokenizer.json.
func (t *tokenizer) json() any {
	if t.wordPiece {
		return t.wordPieceJSON()
	}
	added := t.addedTokens()
	post := any(byteLevel(false))
	if t.cls != 0 {
		post = t.clsTemplate()
	}
	return map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  byteLevel(false),
		"post_processor": post,
		"decoder":        byteLevel(true),
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil,
			"continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": t.orderedVocab(), "merges": t.merges,
		},
	}
}

func byteLevel(prefix bool) map[string]any {
	return map[string]any{"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": true}
}

// addedTokens is tokenizer.json's added_tokens: the special tokens.
func (t *tokenizer) addedTokens() []map[string]any {
	added := make([]map[string]any, len(t.names))
	for i, s := range t.names {
		added[i] = map[string]any{
			"id": t.special[i], "content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true,
		}
	}
	return added
}

// clsTemplate is the TemplateProcessing post-processor of BERT and
// ModernBERT: [CLS] A [SEP], and [CLS] A [SEP] B [SEP] for a pair.
func (t *tokenizer) clsTemplate() map[string]any {
	special := func(s string, typ int) map[string]any {
		return map[string]any{"SpecialToken": map[string]any{"id": s, "type_id": typ}}
	}
	seq := func(s string, typ int) map[string]any {
		return map[string]any{"Sequence": map[string]any{"id": s, "type_id": typ}}
	}
	return map[string]any{
		"type":   "TemplateProcessing",
		"single": []any{special("[CLS]", 0), seq("A", 0), special("[SEP]", 0)},
		"pair":   []any{special("[CLS]", 0), seq("A", 0), special("[SEP]", 0), seq("B", 1), special("[SEP]", 1)},
		"special_tokens": map[string]any{
			"[CLS]": map[string]any{"id": "[CLS]", "ids": []int{t.cls}, "tokens": []string{"[CLS]"}},
			"[SEP]": map[string]any{"id": "[SEP]", "ids": []int{t.sep}, "tokens": []string{"[SEP]"}},
		},
	}
}

// orderedVocab writes the vocabulary object in id order, as Hugging Face
// does, rather than in Go's sorted-key order: the bytes and merges, then
// the special tokens (in added_tokens; here too when fillers follow them)
// and the fillers.
func (t *tokenizer) orderedVocab() json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	entry := func(tok string, id int) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(tok) // a string always marshals
		b.Write(k)
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(id))
	}
	for id, tok := range t.vocab {
		entry(tok, id)
	}
	if len(t.fillers) > 0 {
		// Hugging Face numbers added tokens missing from the model's
		// vocabulary from its size, whatever their "id": with fillers past
		// them, the special tokens must be in it at their own ids.
		for i, name := range t.names {
			entry(name, t.special[i])
		}
	}
	for i, tok := range t.fillers {
		entry(tok, t.special[len(t.special)-1]+1+i)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// configJSON is tokenizer_config.json.
func (t *tokenizer) configJSON(contextLength int) any {
	decoder := map[string]any{}
	for i, s := range t.names {
		decoder[strconv.Itoa(t.special[i])] = map[string]any{
			"content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true,
		}
	}
	if t.cls != 0 {
		return t.encoderConfigJSON(decoder, contextLength)
	}
	return map[string]any{
		"added_tokens_decoder":         decoder,
		"bos_token":                    specialTokens[0],
		"eos_token":                    specialTokens[4],
		"pad_token":                    nil,
		"add_bos_token":                false,
		"add_eos_token":                false,
		"clean_up_tokenization_spaces": false,
		"model_max_length":             contextLength,
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"chat_template":                chatTemplate,
	}
}
