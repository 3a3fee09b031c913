package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postPlan is a post-processor compiled: ids added before and after the
// encoded text of a single sequence when addSpecial is set, and the
// template a pair of sequences is put together by.
type postPlan struct {
	set    bool // a post-processor adds special tokens
	prefix []int32
	suffix []int32
	pair   []pairItem // nil: no pair form
}

// pairItem is one piece of a pair template: special token ids, or the
// first (seq 0) or second (seq 1) sequence, with its token type id.
type pairItem struct {
	ids    []int32
	seq    int // -1 for special tokens
	typeID int32
}

type postSpec struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []templatePiece   `json:"single"`
	Pair          []templatePiece   `json:"pair"`
	SpecialTokens map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
	Cls *[2]json.RawMessage `json:"cls"`
	Sep *[2]json.RawMessage `json:"sep"`
}

type templatePiece struct {
	SpecialToken *struct {
		ID     string `json:"id"`
		TypeID int32  `json:"type_id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID     string `json:"id"`
		TypeID int32  `json:"type_id"`
	} `json:"Sequence"`
}

func parsePostProcessor(raw json.RawMessage, field string) (*postPlan, error) {
	p := &postPlan{}
	if isNull(raw) {
		return p, nil
	}
	return p, p.add(raw, field)
}

func (p *postPlan) add(raw json.RawMessage, field string) error {
	var s postSpec
	if err := json.Unmarshal(raw, &s); err != nil {
		return specErr(field, ErrMalformed, "%v", err)
	}
	switch s.Type {
	case "ByteLevel":
		return nil // offsets only
	case "Sequence":
		for i, sub := range s.Processors {
			if err := p.add(sub, fmt.Sprintf("%s.processors[%d]", field, i)); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		return p.addTemplate(&s, field)
	case "BertProcessing", "RobertaProcessing":
		if s.Cls == nil || s.Sep == nil {
			return specErr(field, ErrMalformed, "%s without cls/sep", s.Type)
		}
		var cls, sep int32
		if json.Unmarshal(s.Cls[1], &cls) != nil || json.Unmarshal(s.Sep[1], &sep) != nil {
			return specErr(field, ErrMalformed, "%s cls/sep ids are not integers", s.Type)
		}
		p.set = true
		p.prefix = append(p.prefix, cls)
		p.suffix = append(p.suffix, sep)
		c, sp := []int32{cls}, []int32{sep}
		if s.Type == "BertProcessing" {
			// [CLS] A [SEP] B [SEP], the second sentence with type 1.
			p.pair = []pairItem{{c, -1, 0}, {nil, 0, 0}, {sp, -1, 0}, {nil, 1, 1}, {sp, -1, 1}}
		} else {
			// <s> A </s></s> B </s>, all type 0 (RoBERTa has no segment embeddings).
			p.pair = []pairItem{{c, -1, 0}, {nil, 0, 0}, {sp, -1, 0}, {sp, -1, 0}, {nil, 1, 0}, {sp, -1, 0}}
		}
		return nil
	case "":
		return specErr(field, ErrMalformed, "missing \"type\"")
	}
	return specErr(field, ErrUnsupported, "post-processor type %q", s.Type)
}

func (p *postPlan) addTemplate(s *postSpec, field string) error {
	p.set = true
	seen := false
	for i, piece := range s.Single {
		switch {
		case piece.Sequence != nil:
			seen = true
		case piece.SpecialToken != nil:
			tok, ok := s.SpecialTokens[piece.SpecialToken.ID]
			if !ok {
				return specErr(fmt.Sprintf("%s.single[%d]", field, i), ErrMalformed, "special token %q not in special_tokens", piece.SpecialToken.ID)
			}
			if seen {
				p.suffix = append(p.suffix, tok.IDs...)
			} else {
				p.prefix = append(p.prefix, tok.IDs...)
			}
		default:
			return specErr(fmt.Sprintf("%s.single[%d]", field, i), ErrMalformed, "neither SpecialToken nor Sequence")
		}
	}
	return p.addPairTemplate(s, field)
}

func (p *postPlan) addPairTemplate(s *postSpec, field string) error {
	if len(s.Pair) == 0 {
		return nil
	}
	p.pair = nil
	for i, piece := range s.Pair {
		f := fmt.Sprintf("%s.pair[%d]", field, i)
		switch {
		case piece.Sequence != nil && (piece.Sequence.ID == "A" || piece.Sequence.ID == "B"):
			seq := 0
			if piece.Sequence.ID == "B" {
				seq = 1
			}
			p.pair = append(p.pair, pairItem{seq: seq, typeID: piece.Sequence.TypeID})
		case piece.Sequence != nil:
			return specErr(f, ErrMalformed, "sequence %q is neither A nor B", piece.Sequence.ID)
		case piece.SpecialToken != nil:
			tok, ok := s.SpecialTokens[piece.SpecialToken.ID]
			if !ok {
				return specErr(f, ErrMalformed, "special token %q not in special_tokens", piece.SpecialToken.ID)
			}
			p.pair = append(p.pair, pairItem{ids: tok.IDs, seq: -1, typeID: piece.SpecialToken.TypeID})
		default:
			return specErr(f, ErrMalformed, "neither SpecialToken nor Sequence")
		}
	}
	return nil
}
