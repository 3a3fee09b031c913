package grammar

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/mail"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// zod v4's schemas (testdata/zod, made by schemas.mjs there) compile, and
// every document a random model writes under them validates: with a JSON
// schema validator (formats asserted, zod's patterns included where RE2
// runs them) and field by field with Go's own parsers.
func TestZodSchemas(t *testing.T) {
	raw, err := os.ReadFile("testdata/zod/zod_v4.json")
	if err != nil {
		t.Fatal(err)
	}
	g, err := byteVocab().Compile(raw, Limits{})
	if err != nil {
		t.Fatalf("zod v4 schema refused: %v", err)
	}
	// The validator runs Go's regexp: zod's duration pattern has
	// lookaheads, so that field is checked by isoDuration below instead.
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	delete(schema["properties"].(map[string]any)["d"].(map[string]any), "pattern")
	forValidator, _ := json.Marshal(schema)
	val := validator(t, string(forValidator))
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 40; i++ {
		doc, _ := sampleDoc(t, g, rng, 6000)
		checkDoc(t, val, string(forValidator), doc)
		var v map[string]any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		checkFormats(t, v)
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

func checkFormats(t *testing.T, v map[string]any) {
	t.Helper()
	str := func(k string) string { s, _ := v[k].(string); return s }
	if a, err := mail.ParseAddress(str("email")); err != nil || a.Address != str("email") {
		t.Errorf("email %q: %v", str("email"), err)
	}
	if !uuidRE.MatchString(str("id")) {
		t.Errorf("uuid %q", str("id"))
	}
	if _, err := time.Parse(time.RFC3339Nano, str("at")); err != nil {
		t.Errorf("date-time %q: %v", str("at"), err)
	}
	if _, err := time.Parse(time.DateOnly, str("day")); err != nil {
		t.Errorf("date %q: %v", str("day"), err)
	}
	if a, err := netip.ParseAddr(str("ip")); err != nil || !a.Is4() {
		t.Errorf("ipv4 %q: %v", str("ip"), err)
	}
	if a, err := netip.ParseAddr(str("ip6")); err != nil || !a.Is6() {
		t.Errorf("ipv6 %q: %v", str("ip6"), err)
	}
	if !isoDuration(str("d")) {
		t.Errorf("duration %q is not an ISO 8601 duration", str("d"))
	}
}

// isoDuration is zod v4's duration check without its lookaheads: weeks
// alone, or at least one of the date and time components, a T only
// before a time component.
func isoDuration(s string) bool {
	if m, _ := regexp.MatchString(`^P\d+W$`, s); m {
		return true
	}
	m := regexp.MustCompile(`^P(\d+Y)?(\d+M)?(\d+D)?(T(\d+H)?(\d+M)?(\d+([.,]\d+)?S)?)?$`).FindStringSubmatch(s)
	if m == nil || s == "P" || strings.HasSuffix(s, "T") {
		return false
	}
	return true
}

func TestDurationNeedsAComponent(t *testing.T) {
	re, err := compileRegex(formats["duration"])
	if err != nil {
		t.Fatal(err)
	}
	full := func(s string) bool {
		ds := re.start
		for _, r := range s {
			if ds = re.step(ds, r); ds == nil {
				return false
			}
		}
		return ds.match
	}
	for _, s := range []string{"P", "PT", "P3DT", "PT1H2", "P1W2D"} {
		if full(s) {
			t.Errorf("duration grammar accepts %q", s)
		}
	}
	for _, s := range []string{"P3D", "PT1H", "P2DT3H4M5S", "PT45S", "P2W"} {
		if !full(s) || !isoDuration(s) {
			t.Errorf("duration grammar refuses %q", s)
		}
	}
}

// The intersection is exact: a prefix each pattern can complete on its
// own, but not both with one string, is dead.
func TestIntersectionIsExact(t *testing.T) {
	re, err := compileIntersect(`^(ab|cd)$`, `^(ad|cb|ab)$`)
	if err != nil {
		t.Fatal(err)
	}
	if n := re.step(re.start, 'c'); n != nil {
		t.Errorf("after %q: a state, want dead (cd and cb part at the second rune)", "c")
	}
	a := re.step(re.start, 'a')
	if a == nil || a.dist != 1 {
		t.Fatalf("after %q: %+v, want one rune from a match", "a", a)
	}
	if re.step(a, 'd') != nil || re.step(a, 'b') == nil || !re.step(a, 'b').match {
		t.Error("after a: want b only")
	}
	if _, err := compileIntersect(`^a+$`, `^b+$`); err == nil {
		t.Error("an empty intersection compiled")
	}
	// Every format zod sends a pattern with intersects in full.
	raw, err := os.ReadFile("testdata/zod/zod_v4.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]struct{ Format, Pattern string }
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	for name, p := range schema.Properties {
		if p.Format == "" || p.Pattern == "" || p.Format == "duration" {
			continue
		}
		if _, err := compileIntersect(p.Pattern, formats[p.Format]); err != nil {
			t.Errorf("%s (format %s): %v", name, p.Format, err)
		}
	}
}

// A record whose keys carry a maxLength (zod v4's
// z.record(z.string().max(3), z.number()) sends it as propertyNames)
// compiles, and every key a random model writes keeps it.
func TestPropertyNamesMaxLength(t *testing.T) {
	schema := `{"type":"object","propertyNames":{"type":"string","maxLength":3},"additionalProperties":{"type":"number"}}`
	g, err := byteVocab().Compile([]byte(schema), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	s := validator(t, schema)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 40 {
		doc, _ := sampleDoc(t, g, rng, 4000)
		checkDoc(t, s, schema, doc)
	}
	if _, err := byteVocab().Compile([]byte(`{"type":"object","propertyNames":{"type":"string","pattern":"^a"}}`), Limits{}); err == nil {
		t.Error("propertyNames with a pattern accepted")
	}
}

// zodOrder is what zod v4's toJSONSchema writes for a discriminated union
// (oneOf), a union (anyOf), a default, an optional nullable field and an
// array of objects.
const zodOrder = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{
 "delivery":{"oneOf":[
  {"type":"object","properties":{"type":{"type":"string","const":"pickup"},"store":{"type":"string","maxLength":6}},"required":["type","store"],"additionalProperties":false},
  {"type":"object","properties":{"type":{"type":"string","const":"ship"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["type","zip"],"additionalProperties":false}]},
 "qty":{"anyOf":[{"type":"integer","minimum":1,"maximum":9},{"type":"string","const":"many"}]},
 "gift":{"default":false,"type":"boolean"},
 "lines":{"minItems":1,"maxItems":2,"type":"array","items":{"type":"object","properties":{"sku":{"type":"string","maxLength":6},"n":{"type":"integer","minimum":1,"maximum":9}},"required":["sku","n"],"additionalProperties":false}},
 "note":{"anyOf":[{"type":"string","maxLength":8},{"type":"null"}]}},
 "required":["delivery","qty","gift","lines"],"additionalProperties":false}`

// A discriminated union (oneOf told apart by a const) compiles, and
// every document validates, oneOf included (exactly one alternative).
func TestZodDiscriminatedUnion(t *testing.T) {
	g, err := byteVocab().Compile([]byte(zodOrder), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	s := validator(t, zodOrder)
	rng := rand.New(rand.NewPCG(4, 4))
	kinds := map[string]bool{}
	for range 60 {
		doc, _ := sampleDoc(t, g, rng, 20000)
		checkDoc(t, s, zodOrder, doc)
		var v struct{ Delivery struct{ Type string } }
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		kinds[v.Delivery.Type] = true
	}
	if !kinds["pickup"] || !kinds["ship"] {
		t.Errorf("alternatives generated: %v, want both", kinds)
	}
	for _, overlap := range []string{
		`{"oneOf":[{"type":"object","properties":{"k":{"const":"a"}}},{"type":"object","properties":{"k":{"const":"b"}}}]}`, // k not required
		`{"oneOf":[{"type":"object","properties":{"k":{"enum":["a","b"]}},"required":["k"]},{"type":"object","properties":{"k":{"const":"b"}},"required":["k"]}]}`,
		`{"oneOf":[{"type":"integer"},{"type":"number"}]}`,
	} {
		if _, err := byteVocab().Compile([]byte(overlap), Limits{}); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Compile(%s) = %v, want ErrUnsupported", overlap, err)
		}
	}
}
