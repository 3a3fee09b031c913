// Package tokenizer is the text layer shared by every engine, the batcher
// and the HTTP layer: Hugging Face tokenizer.json files in pure Go, chat
// templates, and streaming detokenization with stop strings.
//
// Use:
//
//	tok, err := tokenizer.Load(checkpointDir) // tokenizer.json + tokenizer_config.json
//	prompt, err := tok.ApplyChatTemplate(msgs, tokenizer.ChatOptions{AddGenerationPrompt: true})
//	ids, err := tok.Encode(prompt, false) // the template already wrote BOS
//	dec := tok.NewStreamDecoder(ids, []string{"\nUser:"})
//	delta, stopped := dec.Add(next) // per generated token; dec.Flush() at the end
//
// # Tokenizers
//
// BPE models are supported in the two shapes current checkpoints use:
// byte-level BPE (GPT-2, Llama 3/3.1, Qwen2/2.5/3: Split and ByteLevel
// pre-tokenizers, NFC normalization) and SentencePiece-style BPE (Llama 2,
// Mistral: Prepend/Replace or Metaspace normalization, byte_fallback, the
// Replace/ByteFallback/Fuse/Strip decoders). Added and special tokens
// written in the text are matched before anything else. Pre-tokenizer
// regular expressions run on github.com/dlclark/regexp2 (look-ahead, \s
// matching NBSP as Oniguruma does); the GPT-2, Llama 3 and Qwen2 patterns
// have hand-written matchers that give the same splits much faster.
//
// The BERT family's WordPiece tokenizers (bert, MiniLM, bge, e5, gte) load
// as Hugging Face's tokenizers runs them: the BertNormalizer (clean_text,
// CJK spacing, strip_accents null/true/false, lowercase), the
// BertPreTokenizer (whitespace, then every ASCII or Unicode punctuation
// character on its own), greedy longest-match WordPiece with its
// continuing-subword prefix, unknown token and max_input_chars_per_word,
// BertProcessing or TemplateProcessing, and the WordPiece decoder (the
// first token written as spelled, later ones joined by their "##" or a
// space, cleanup). Where the JavaScript port of tokenizers departs from
// the Rust one, this package follows Rust: CJK ideographs outside the BMP
// are spaced out, and lowercasing is per character (no final-sigma rule).
// Character classes come from Go's Unicode tables, which are newer than
// the Unicode 9 tables Rust's BertNormalizer and BertPreTokenizer use for
// punctuation, control and nonspacing-mark categories: a character
// assigned to such a category after Unicode 9 may be treated differently.
//
// Unigram models (SentencePiece unigram: XLM-RoBERTa, multilingual-e5,
// bge-m3, T5) run Hugging Face's Viterbi (the best-scoring segmentation,
// first-found ties, fused unknown runs, byte_fallback), with their
// Precompiled normalizer (the serialized SentencePiece character map,
// applied as Hugging Face's spm_precompiled does: a grapheme cluster
// shorter than 6 bytes is replaced whole when a prefix of it is in the
// map, anything else character by character) and Replace normalizers
// with a regular expression (XLM-RoBERTa's " {2,}"). The grapheme
// clusters follow UAX #29 except the emoji ZWJ and Indic conjunct rules,
// which only make clusters long enough to be mapped per character anyway.
// A Metaspace decoder removes every "▁" of the first token, as Hugging
// Face's does (not only a leading one).
//
// The WordPiece and Unigram tests compare with two references: the
// JavaScript port (@huggingface/tokenizers) on a few hundred texts, and
// Hugging Face's Rust tokenizers 0.22.2 (through a Node binding) on the
// same texts plus those where the port departs from Rust, and for the
// Precompiled normalizer on SentencePiece's own nmt_nfkc map (the one
// XLM-RoBERTa carries) with 300 random grapheme-heavy texts.
//
// Other model types (WordLevel) and components are refused with
// ErrUnsupported, naming the field.
//
// EncodePair joins two texts by the post-processor's pair form and
// returns token type ids, for cross-encoders and sentence-pair models.
// EncodeTruncated cuts a text's ids to a limit before adding the special
// tokens, as Hugging Face's right truncation (sentence-transformers'
// max_seq_length) does. The truncation and padding settings a
// tokenizer.json may carry are not applied by Encode (transformers turns
// them off unless a call asks for them).
//
// Decode returns text exactly as the tokens spell it; transformers'
// clean_up_tokenization_spaces is not applied (the WordPiece decoder's own
// cleanup is).
//
// # Chat templates
//
// Templates from tokenizer_config.json (a string or a named list) run on
// github.com/nikolalohinski/gonja/v2 in an environment built per
// tokenizer: no file-system loader, copies of the built-ins, Hugging
// Face's Jinja2 settings (trim_blocks, lstrip_blocks), Python's json.dumps
// for tojson, raise_exception and strftime_now, Python's negative indexes.
// Go maps in messages, tools and extra variables are iterated and
// serialized in sorted key order, where Python keeps insertion order.
// gonja's string methods split, rsplit, strip, lstrip, rstrip and replace
// are replaced by Python-exact ones, and transformers' {% generation %}
// block is understood. A conditional expression inside brackets
// ("x + (a if c else b)", as Gemma 3's template writes), which gonja parses
// only at the top of a tag, is rewritten before parsing into an equivalent
// that evaluates only the chosen branch. Known differences from Python's
// Jinja2 that remain (none used by the templates tested): "%" string
// formatting is not supported; 2 ** 3 gives 8.0; -7 // 2 gives -3;
// {{ none }} prints nothing instead of "None". Each fails loudly or is covered in the tests.
//
// # Errors
//
// Loading errors are *FileError values naming the file and field and
// wrapping ErrMalformed or ErrUnsupported; Encode refuses invalid UTF-8
// with a *UTF8Error; template failures are *TemplateError (ErrTemplate).
// Nothing in this package panics on bad input.
package tokenizer
