package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
)

// configSpec is the part of tokenizer_config.json this package reads.
type configSpec struct {
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	AddBOSToken  *bool           `json:"add_bos_token"`
	AddEOSToken  *bool           `json:"add_eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// applyConfig reads tokenizer_config.json: special tokens, add_*_token and
// chat templates.
func (t *Tokenizer) applyConfig(data []byte, file string) error {
	var c configSpec
	if err := json.Unmarshal(data, &c); err != nil {
		return specErr("", ErrMalformed, "not valid JSON: %v", err)
	}
	bos, err := tokenNames(c.BOSToken, "bos_token")
	if err != nil {
		return err
	}
	if len(bos) > 0 {
		id, ok := t.TokenID(bos[0])
		if !ok {
			return specErr("bos_token", ErrMalformed, "%q is not a token", bos[0])
		}
		t.bos, t.hasBOS = id, true
		t.bosText = bos[0]
	}
	eos, err := tokenNames(c.EOSToken, "eos_token")
	if err != nil {
		return err
	}
	for _, name := range eos {
		id, ok := t.TokenID(name)
		if !ok {
			return specErr("eos_token", ErrMalformed, "%q is not a token", name)
		}
		if !slices.Contains(t.eos, id) {
			t.eos = append(t.eos, id)
		}
	}
	if len(eos) > 0 {
		t.eosText = eos[0]
	}
	t.addBOS = boolOr(c.AddBOSToken, false)
	t.addEOS = boolOr(c.AddEOSToken, false)
	t.templates, err = parseChatTemplates(c.ChatTemplate, file)
	return err
}

// tokenNames reads a special-token field: null, a string, an AddedToken
// object {"content": ...}, or a list of those.
func tokenNames(raw json.RawMessage, field string) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		var out []string
		for i, item := range list {
			names, err := tokenNames(item, fmt.Sprintf("%s[%d]", field, i))
			if err != nil {
				return nil, err
			}
			out = append(out, names...)
		}
		return out, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return []string{*obj.Content}, nil
	}
	return nil, specErr(field, ErrMalformed, "neither a string, a token object nor a list")
}
