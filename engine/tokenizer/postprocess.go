package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postPlan is a post-processor compiled for single sequences: ids added
// before and after the encoded text when addSpecial is set.
type postPlan struct {
	set    bool // a post-processor adds special tokens
	prefix []int32
	suffix []int32
}

type postSpec struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []templatePiece   `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
	Cls *[2]json.RawMessage `json:"cls"`
	Sep *[2]json.RawMessage `json:"sep"`
}

type templatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
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
	return nil
}
