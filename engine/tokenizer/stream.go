package tokenizer

import (
	"bytes"
	"unicode/utf8"
)

// StreamDecoder turns one generated sequence's token ids into text deltas,
// one token at a time, and watches for stop strings. Deltas are always
// valid UTF-8: bytes of an unfinished multi-byte character are held back
// until the character completes, and text that may be the start of a stop
// string is held back until it is known not to be one. Special tokens
// produce no text.
//
// The concatenated deltas (plus Flush) equal
// Decode(prompt+generated, true) minus Decode(prompt, true) when no stop
// string is hit. A StreamDecoder serves one sequence and is not safe for
// concurrent use. Make one with Tokenizer.NewStreamDecoder; the zero value
// is not usable.
type StreamDecoder struct {
	t       *Tokenizer
	stops   []string
	maxStop int
	strip   int    // leading spaces the decoder still strips (see appendPiece)
	first   bool   // no token has produced output yet (see Tokenizer.firstPiece)
	raw     []byte // bytes of an unfinished UTF-8 sequence
	text    []byte // decoded text held back for stop strings
	stopped bool
}

// NewStreamDecoder starts decoding a sequence that follows prompt. The
// prompt is not decoded into deltas; it tells the decoder whether
// generated text starts the output (SentencePiece decoders drop the
// leading space of the very first word only). Empty and invalid UTF-8 stop
// strings are ignored.
func (t *Tokenizer) NewStreamDecoder(prompt []int32, stop []string) *StreamDecoder {
	d := &StreamDecoder{t: t, strip: t.dec.stripStart, first: true}
	for _, s := range stop {
		if s == "" || !utf8.ValidString(s) {
			continue
		}
		d.stops = append(d.stops, s)
		d.maxStop = max(d.maxStop, len(s))
	}
	for _, id := range prompt {
		if d.strip == 0 && !d.first {
			break
		}
		if piece, ok, err := t.piece(id, true); err == nil && ok {
			piece, d.strip = t.firstPiece(id, piece, d.strip, d.first)
			d.first = false
			_, d.strip = appendPiece(nil, piece, d.strip)
		}
	}
	return d
}

// NeverStops reports whether the decoder has no stop strings: Add then
// never reports a stop, so a batcher may detokenize behind its next step
// (batcher.WithTextBehindStep).
func (d *StreamDecoder) NeverStops() bool { return len(d.stops) == 0 }

// Add feeds the next generated token. delta is the text that became final
// with it (possibly empty). When a stop string completes, stopped is true
// and delta holds only the text before the stop string; every later call
// returns "", true. Ids outside the vocabulary produce no text.
func (d *StreamDecoder) Add(id int32) (delta string, stopped bool) {
	if d.stopped {
		return "", true
	}
	piece, ok, err := d.t.piece(id, true)
	if err != nil || !ok {
		return "", false
	}
	piece, d.strip = d.t.firstPiece(id, piece, d.strip, d.first)
	d.first = false
	d.raw, d.strip = appendPiece(d.raw, piece, d.strip)
	var n int
	d.text, n = lossyAppend(d.text, d.raw, false)
	d.raw = d.raw[:copy(d.raw, d.raw[n:])]
	return d.release(false)
}

// Flush returns the text still held back, at the end of a sequence that
// did not hit a stop string (maximum tokens, EOS). After a stop it returns
// "".
func (d *StreamDecoder) Flush() string {
	if d.stopped {
		return ""
	}
	d.text, _ = lossyAppend(d.text, d.raw, true)
	d.raw = d.raw[:0]
	delta, _ := d.release(true)
	return delta
}

// Stopped reports whether a stop string has been hit.
func (d *StreamDecoder) Stopped() bool { return d.stopped }

// release emits the decoded text that can no longer be part of a stop
// string (all of it when final).
func (d *StreamDecoder) release(final bool) (string, bool) {
	if len(d.text) == 0 {
		return "", false
	}
	if len(d.stops) == 0 {
		s := string(d.text)
		d.text = d.text[:0]
		return s, false
	}
	cut := -1
	for _, s := range d.stops {
		if i := bytes.Index(d.text, []byte(s)); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		d.stopped = true
		emit := string(d.text[:cut])
		d.text = d.text[:0]
		return emit, true
	}
	keep := 0
	if !final {
		keep = d.heldBack(d.text)
	}
	n := len(d.text) - keep
	emit := string(d.text[:n])
	d.text = d.text[:copy(d.text, d.text[n:])]
	return emit, false
}

// heldBack is the length of the longest suffix of text that is a proper
// prefix of a stop string.
func (d *StreamDecoder) heldBack(text []byte) int {
	for k := min(len(text), d.maxStop-1); k > 0; k-- {
		suffix := text[len(text)-k:]
		for _, s := range d.stops {
			if len(s) >= k && s[:k] == string(suffix) {
				return k
			}
		}
	}
	return 0
}
