// Package grammar constrains decoding to JSON that matches a JSON schema.
//
// Compile turns a schema (the subset OpenAI's structured outputs accept:
// objects with required and optional properties, arrays, enum, const,
// strings with lengths, patterns and common formats, numbers and integers
// with bounds, booleans, null, anyOf, oneOf whose alternatives cannot
// overlap (zod v4's discriminated unions), $ref into $defs) or "any JSON object"
// into a [Grammar] bound to one model vocabulary ([Vocab]). A [Matcher]
// follows one generated sequence: at every step it fills the set of token
// ids that keep the output a valid prefix of a matching document, and
// Accept advances it with the token the sampler picked. EOS is allowed only
// once the document is complete.
//
// The matcher works on bytes, so it is tokenizer-aware without knowing the
// tokenizer: a token is allowed when all its bytes are accepted in order
// (multi-character tokens, byte-level BPE pieces and SentencePiece byte
// fallbacks alike). The vocabulary is kept as a byte trie walked with
// pruning; inside free strings, where nearly every token is allowed, a
// precomputed set of "string-safe" tokens by length replaces the walk,
// and at number positions the tokens made of digits alone come from
// lists by length (and, for numbers with bounds, a cache of the
// grammar) instead of being walked digit by digit.
//
// Formats (date-time, date, time, duration, email, hostname, ipv4, ipv6,
// uuid) have grammars that generate only values their validators accept.
// A format with a pattern (zod v4 sends both for z.email(), z.uuid() and
// z.iso.*()) matches what both accept: the two automata run as one,
// explored once at compile time so that no prefix is offered that cannot
// be finished. propertyNames is accepted when it asks only for strings,
// optionally with a maxLength that bounds the free keys.
//
// Where the schema leaves one way to go on (a declared key, '":', a
// closing brace, the rest of an enum value), [Matcher.ForcedTokens]
// returns those tokens, tokenized with the vocabulary's [Encoder] and cut
// so that sampling could have produced them, for jump-forward decoding
// (SentencePiece tokenizers, which put a space in front of what they
// encode, included).
//
// Free whitespace, number length, unconstrained string length, array and
// object sizes, the total number of values and the tokens spent in
// free-form values (json_object, {}) are bounded (see [Limits]), so that
// even a model that samples at random ends with a complete document
// within a modest number of tokens (a json_object within 256).
//
// Compile warms what the first documents would otherwise compute: the
// token sets of every state of the schema's patterns and formats (an
// email or hostname state costs up to 20 ms the first time), and the
// digit tokens that may start each number with bounds. Patterns are
// compiled once per vocabulary, so schemas sharing a format share that
// work.
//
//	v := grammar.NewVocab(pieces, eos, special)
//	g, err := v.Compile(schema, grammar.Limits{})
//	m := g.NewMatcher()
//	for !m.Done() {
//		m.FillMask(mask) // bit i of mask: token i allowed
//		tok := sample(logits, mask)
//		m.Accept(tok)
//	}
package grammar
