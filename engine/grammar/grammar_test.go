package grammar

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

var fixedSchemas = []string{
	`{"type":"object"}`,
	`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":130},"email":{"type":"string","format":"email"}},"required":["name","age"],"additionalProperties":false}`,
	`{"type":"array","items":{"type":"number","minimum":-1.5,"exclusiveMaximum":2},"minItems":1,"maxItems":4}`,
	`{"enum":["red","green",3,null,{"a":[1,2]}]}`,
	`{"anyOf":[{"type":"string","pattern":"^[a-z]{2,5}$"},{"type":"boolean"},{"type":"null"}]}`,
	`{"type":"object","properties":{"when":{"type":"string","format":"date-time"},"id":{"type":"string","format":"uuid"},"day":{"type":"string","format":"date"}},"required":["when","id","day"]}`,
	`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"}`,
	`{"type":"object","properties":{"k":{"const":"fixed \"quoted\" é"},"s":{"type":"string","minLength":3,"maxLength":5}},"required":["k","s"]}`,
	`{"type":["integer","string"]}`,
	`{"type":"object","additionalProperties":{"type":"integer","minimum":10,"maximum":12},"maxProperties":3}`,
	`{"type":"number"}`,
}

func TestFixedSchemasByteVocab(t *testing.T) {
	v := byteVocab()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, schema := range fixedSchemas {
		g, err := v.Compile([]byte(schema), Limits{})
		if err != nil {
			t.Fatalf("Compile(%s): %v", schema, err)
		}
		val := validator(t, schema)
		for i := 0; i < 50; i++ {
			doc, _ := sampleDoc(t, g, rng, 20000)
			checkDoc(t, val, schema, doc)
		}
	}
}

func TestUnsupported(t *testing.T) {
	v := byteVocab()
	for schema, keyword := range map[string]string{
		`{"type":"object","patternProperties":{"a":{}}}`:                "patternProperties",
		`{"type":"string","format":"idn-email"}`:                        "format: idn-email",
		`{"oneOf":[{"type":"string"},{"type":"string","maxLength":3}]}`: "oneOf whose alternatives may overlap",
		`{"type":"array","items":{"type":"integer","multipleOf":3}}`:    "multipleOf",
		`{"$ref":"http://example.com/s.json"}`:                          "$ref: http://example.com/s.json",
		`{"not":{}}`:                                                    "not",
	} {
		_, err := v.Compile([]byte(schema), Limits{})
		var ue *UnsupportedError
		if !errors.As(err, &ue) || !errors.Is(err, ErrUnsupported) || ue.Keyword != keyword {
			t.Errorf("Compile(%s) = %v, want UnsupportedError naming %q", schema, err, keyword)
		}
	}
	for _, schema := range []string{`[1]`, `{"type":"strin"}`, `{"type":"string","minLength":5,"maxLength":2}`,
		`{"$ref":"#/$defs/missing"}`, `{"type":"integer","minimum":1.2,"maximum":1.5}`, `{`, `{"enum":[]}`} {
		if _, err := v.Compile([]byte(schema), Limits{}); !errors.Is(err, ErrBadSchema) {
			t.Errorf("Compile(%s) = %v, want ErrBadSchema", schema, err)
		}
	}
	if _, err := v.Compile(AnyObject, Limits{MaxItems: -1}); err == nil {
		t.Error("negative limit accepted")
	}
}

func TestAcceptRejects(t *testing.T) {
	v := byteVocab()
	g, err := v.Compile([]byte(`{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher()
	id := func(s string) int32 {
		for i, p := range v.pieces {
			if string(p) == s {
				return int32(i)
			}
		}
		t.Fatalf("no token %q", s)
		return 0
	}
	if err := m.Accept(0); !errors.Is(err, ErrRejected) {
		t.Fatalf("EOS at start: %v", err)
	}
	for _, s := range []string{`{"`, "a", `":`, " ", "t"} {
		if err := m.Accept(id(s)); err != nil {
			t.Fatalf("Accept(%q): %v", s, err)
		}
	}
	if err := m.Accept(id("x")); !errors.Is(err, ErrRejected) {
		t.Fatalf("Accept(x) in true: %v", err)
	}
	for _, s := range []string{"r", "u", "e"} {
		if err := m.Accept(id(s)); err != nil {
			t.Fatal(err)
		}
	}
	if m.CanEnd() || m.Done() {
		t.Fatal("complete before }")
	}
	if err := m.Accept(id("}")); err != nil {
		t.Fatal(err)
	}
	if !m.Done() || !m.CanEnd() {
		t.Fatal("not done after }")
	}
	mask := make([]uint64, v.MaskWords())
	m.FillMask(mask)
	for i := int32(0); i < int32(v.Size()); i++ {
		if engine.MaskAllows(mask, i) != (i == 0) {
			t.Fatalf("after the document, token %d allowed=%v", i, engine.MaskAllows(mask, i))
		}
	}
}
