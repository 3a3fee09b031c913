package grammar

import "fmt"

// Limits bound what a generated document may hold, so that generation
// ends within a predictable number of tokens. A zero field takes its
// default; a negative one is refused.
type Limits struct {
	// MaxWhitespace caps a run of free whitespace bytes between tokens
	// (default 16: a newline and a few levels of indentation).
	MaxWhitespace int
	// MaxStringLength caps strings whose schema gives no maxLength, in
	// characters (default 256).
	MaxStringLength int
	// MaxItems caps arrays whose schema gives no maxItems (default 32).
	MaxItems int
	// MaxProperties caps free-form objects (no declared properties) whose
	// schema gives no maxProperties (default 32).
	MaxProperties int
	// MaxDepth caps the nesting of arrays and objects; at the cap only
	// scalars, required properties and minimum items are generated
	// (default 10).
	MaxDepth int
	// MaxValues caps the values in the whole document; once reached,
	// optional properties, items beyond minItems and nested containers of
	// free-form values are no longer generated (default 256).
	MaxValues int
	// MaxIntDigits caps the digits before a number's decimal point
	// (default 15, exact in a float64).
	MaxIntDigits int
	// MaxFracDigits caps the digits after it (default 8).
	MaxFracDigits int
	// MaxFreeTokens caps the tokens a document spends inside free-form
	// values, those the schema leaves open (json_object, {}, objects
	// without declared properties, items of any type). Past it the
	// document only closes: free strings end, free objects and arrays of
	// free items take no more members, no free container opens, and no
	// more whitespace is generated anywhere (default 192, so that even a
	// model sampling at random ends a json_object within 256 tokens).
	MaxFreeTokens int
}

// Validate refuses negative fields.
func (l Limits) Validate() error {
	_, err := l.withDefaults()
	return err
}

func (l Limits) withDefaults() (Limits, error) {
	fields := []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxWhitespace", &l.MaxWhitespace, 16},
		{"MaxStringLength", &l.MaxStringLength, 256},
		{"MaxItems", &l.MaxItems, 32},
		{"MaxProperties", &l.MaxProperties, 32},
		{"MaxDepth", &l.MaxDepth, 10},
		{"MaxValues", &l.MaxValues, 256},
		{"MaxIntDigits", &l.MaxIntDigits, 15},
		{"MaxFracDigits", &l.MaxFracDigits, 8},
		{"MaxFreeTokens", &l.MaxFreeTokens, 192},
	}
	for _, f := range fields {
		if *f.v < 0 {
			return l, fmt.Errorf("grammar: Limits.%s is %d: want 0 (default) or more", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if l.MaxDepth > 200 {
		l.MaxDepth = 200
	}
	if l.MaxIntDigits > 18 {
		l.MaxIntDigits = 18
	}
	return l, nil
}
