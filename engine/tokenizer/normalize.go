package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a text segment before pre-tokenization.
type normalizer func(s string) string

// componentSpec is the common shape of tokenizer.json components.
type componentSpec struct {
	Type string `json:"type"`
	// Sequence members (the key differs per component kind).
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	Processors    []json.RawMessage `json:"processors"`
	// Prepend, Replace, Strip, Split, Metaspace.
	Prepend     string           `json:"prepend"`
	Pattern     *patternSpec     `json:"pattern"`
	Content     *json.RawMessage `json:"content"`
	Left        bool             `json:"left"`
	Right       bool             `json:"right"`
	Start       int              `json:"start"`
	Stop        int              `json:"stop"`
	Behavior    string           `json:"behavior"`
	Invert      bool             `json:"invert"`
	Replacement string           `json:"replacement"`
	// ByteLevel, Metaspace.
	AddPrefixSpace   *bool  `json:"add_prefix_space"`
	UseRegex         *bool  `json:"use_regex"`
	PrependScheme    string `json:"prepend_scheme"`
	Split            *bool  `json:"split"`
	IndividualDigits bool   `json:"individual_digits"`
	// WordPiece decoder.
	Prefix  *string `json:"prefix"`
	Cleanup *bool   `json:"cleanup"`
	// Precompiled normalizer.
	PrecompiledCharsmap *string `json:"precompiled_charsmap"`
}

type patternSpec struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// specErr builds a *FileError for field with a sentinel.
func specErr(field string, sentinel error, format string, args ...any) error {
	return &FileError{Field: field, Reason: fmt.Sprintf(format, args...), Err: sentinel}
}

func parseComponent(raw json.RawMessage, field string) (*componentSpec, error) {
	var c componentSpec
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, specErr(field, ErrMalformed, "%v", err)
	}
	if c.Type == "" {
		return nil, specErr(field, ErrMalformed, "missing \"type\"")
	}
	return &c, nil
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// contentString reads a component's "content" as a string.
func (c *componentSpec) contentString(field string) (string, error) {
	if c.Content == nil {
		return "", specErr(field, ErrMalformed, "missing \"content\"")
	}
	var s string
	if err := json.Unmarshal(*c.Content, &s); err != nil {
		return "", specErr(field, ErrMalformed, "\"content\" is not a string")
	}
	return s, nil
}

// parseNormalizers flattens a normalizer (or Sequence) into a list.
func parseNormalizers(raw json.RawMessage, field string) ([]normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := parseComponent(raw, field)
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var out []normalizer
		for i, sub := range c.Normalizers {
			ns, err := parseNormalizers(sub, fmt.Sprintf("%s.normalizers[%d]", field, i))
			if err != nil {
				return nil, err
			}
			out = append(out, ns...)
		}
		return out, nil
	case "NFC":
		return []normalizer{norm.NFC.String}, nil
	case "NFD":
		return []normalizer{norm.NFD.String}, nil
	case "NFKC":
		return []normalizer{norm.NFKC.String}, nil
	case "NFKD":
		return []normalizer{norm.NFKD.String}, nil
	case "BertNormalizer":
		var b bertNormalizerSpec
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, specErr(field, ErrMalformed, "%v", err)
		}
		return []normalizer{newBertNormalizer(b)}, nil
	case "Lowercase":
		// Per character with the full mapping (İ becomes i + U+0307), as
		// Rust's char::to_lowercase; strings.ToLower maps İ to a plain i.
		return []normalizer{bertLowercase}, nil
	case "Prepend":
		p := c.Prepend
		return []normalizer{func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		}}, nil
	case "Precompiled":
		if c.PrecompiledCharsmap == nil {
			return nil, specErr(field, ErrMalformed, "Precompiled normalizer without precompiled_charsmap")
		}
		p, err := newPrecompiled(*c.PrecompiledCharsmap, field)
		if err != nil {
			return nil, err
		}
		return []normalizer{p.normalize}, nil
	case "Replace":
		if c.Pattern == nil || (c.Pattern.String == nil && c.Pattern.Regex == nil) {
			return nil, specErr(field, ErrMalformed, "Replace normalizer without a pattern")
		}
		content, err := c.contentString(field)
		if err != nil {
			return nil, err
		}
		if c.Pattern.String == nil {
			n, err := newRegexReplace(*c.Pattern.Regex, content, field)
			if err != nil {
				return nil, err
			}
			return []normalizer{n}, nil
		}
		old := *c.Pattern.String
		return []normalizer{func(s string) string { return strings.ReplaceAll(s, old, content) }}, nil
	case "Strip":
		left, right := c.Left, c.Right
		return []normalizer{func(s string) string {
			if left {
				s = strings.TrimLeft(s, unicodeSpace)
			}
			if right {
				s = strings.TrimRight(s, unicodeSpace)
			}
			return s
		}}, nil
	}
	return nil, specErr(field, ErrUnsupported, "normalizer type %q", c.Type)
}

// unicodeSpace lists the White_Space characters Strip removes.
const unicodeSpace = "\t\n\v\f\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
