package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// decodePlan is a tokenizer.json decoder compiled into per-token steps:
// each token's text becomes bytes on its own, and stripStart leading
// spaces are removed from the start of the whole output.
type decodePlan struct {
	byteLevel    bool // map runes back through the byte-level table
	replaces     [][2]string
	byteFallback bool // <0xXX> tokens become that byte
	stripStart   int  // leading spaces removed from the whole output
	wordPiece    *wordPieceDecoder
	// dropFirst is the Metaspace replacement rune when the decoder starts
	// with a Metaspace step that prepends: Hugging Face's Metaspace decoder
	// removes every one of them from the first token (not only a leading
	// one) and turns them into spaces in the others.
	dropFirst string
}

// firstBytes returns a token's bytes when it starts the output, for
// decoders that treat the first token differently (WordPiece, Metaspace);
// ok is false for the others.
func (p *decodePlan) firstBytes(tok string, bl *byteLevelTable) (b []byte, ok bool) {
	switch {
	case p.wordPiece != nil:
		return []byte(p.wordPiece.first(tok)), true
	case p.dropFirst != "":
		return p.tokenBytes(strings.ReplaceAll(tok, p.dropFirst, ""), bl), true
	}
	return nil, false
}

// wordPieceDecoder is the WordPiece decoder: each token after the first
// loses its continuing-subword prefix or gets a space before it, then,
// with cleanup, loses the space again before punctuation.
type wordPieceDecoder struct {
	prefix  string
	cleanup bool
}

// piece is a token's text anywhere but at the start of the output.
func (w *wordPieceDecoder) piece(tok string) string {
	if rest, ok := strings.CutPrefix(tok, w.prefix); ok {
		tok = rest
	} else {
		tok = " " + tok
	}
	if w.cleanup {
		tok = wordPieceCleanup(tok)
	}
	return tok
}

// first is a token's text at the start of the output.
func (w *wordPieceDecoder) first(tok string) string {
	if w.cleanup {
		return wordPieceCleanup(tok)
	}
	return tok
}

// tokenBytes turns one token's text into its output bytes.
func (p *decodePlan) tokenBytes(tok string, bl *byteLevelTable) []byte {
	if p.wordPiece != nil {
		return []byte(p.wordPiece.piece(tok))
	}
	if p.byteFallback {
		if b, ok := parseByteToken(tok); ok {
			return []byte{b}
		}
	}
	for _, r := range p.replaces {
		tok = strings.ReplaceAll(tok, r[0], r[1])
	}
	if p.byteLevel {
		raw, _ := bl.toBytes(tok)
		return raw
	}
	return []byte(tok)
}

// parseByteToken recognises "<0xXX>".
func parseByteToken(tok string) (byte, bool) {
	if len(tok) != 6 || !strings.HasPrefix(tok, "<0x") || tok[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(tok[3:5], 16, 8)
	if err != nil {
		return 0, false
	}
	return byte(v), true
}

// parseDecoder compiles a decoder (or Sequence of decoders). Steps that
// cannot be expressed per token (a Strip before Fuse, a Strip at the end)
// are refused as unsupported.
func parseDecoder(raw json.RawMessage, field string) (*decodePlan, error) {
	p := &decodePlan{}
	if isNull(raw) {
		return p, nil
	}
	c, err := parseComponent(raw, field)
	if err != nil {
		return nil, err
	}
	if c.Type == "WordPiece" {
		p.wordPiece = &wordPieceDecoder{prefix: "##", cleanup: boolOr(c.Cleanup, true)}
		if c.Prefix != nil {
			p.wordPiece.prefix = *c.Prefix
		}
		p.stripStart = 1 // the first token gets no space; see firstPieces for the rest
		return p, nil
	}
	steps := []*componentSpec{c}
	if c.Type == "Sequence" {
		steps = steps[:0]
		for i, sub := range c.Decoders {
			sc, err := parseComponent(sub, fmt.Sprintf("%s.decoders[%d]", field, i))
			if err != nil {
				return nil, err
			}
			steps = append(steps, sc)
		}
	}
	fused := len(steps) == 1
	for i, st := range steps {
		f := field
		if c.Type == "Sequence" {
			f = fmt.Sprintf("%s.decoders[%d]", field, i)
		}
		if err := p.addStep(st, f, &fused); err != nil {
			return nil, err
		}
		if i == 0 && st.Type == "Metaspace" && p.stripStart == 1 {
			// Later steps see the first token as Metaspace left it only
			// while no step merges tokens, which holds when it comes first.
			p.dropFirst = p.replaces[0][0]
		}
	}
	return p, nil
}

func (p *decodePlan) addStep(st *componentSpec, field string, fused *bool) error {
	switch st.Type {
	case "ByteLevel":
		p.byteLevel = true
	case "ByteFallback":
		p.byteFallback = true
	case "Fuse":
		*fused = true
	case "Replace":
		if st.Pattern == nil || st.Pattern.String == nil {
			return specErr(field, ErrUnsupported, "Replace decoder needs a String pattern")
		}
		content, err := st.contentString(field)
		if err != nil {
			return err
		}
		p.replaces = append(p.replaces, [2]string{*st.Pattern.String, content})
	case "Strip":
		content, err := st.contentString(field)
		if err != nil {
			return err
		}
		if content != " " || st.Stop != 0 || !*fused {
			return specErr(field, ErrUnsupported, "Strip decoder other than leading spaces after Fuse")
		}
		p.stripStart = st.Start
	case "Metaspace":
		m, err := newMetaspace(st, field)
		if err != nil {
			return err
		}
		p.replaces = append(p.replaces, [2]string{m.replacement, " "})
		if m.scheme != "never" {
			p.stripStart = 1
		}
	default:
		return specErr(field, ErrUnsupported, "decoder type %q", st.Type)
	}
	return nil
}
