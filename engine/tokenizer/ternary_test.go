package tokenizer

import (
	"strings"
	"testing"
)

// TestRewriteConditionals covers the source rewrite itself; the renderings
// are checked against Jinja2 by TestChatTemplateGolden
// (testdata/templates/conditional.jinja and Gemma 3's template).
func TestRewriteConditionals(t *testing.T) {
	cases := []struct {
		name, src string
		changed   bool
	}{
		{"none", "{{ a if b else c }}{% set x = y if z else w %}", false},
		{"for filter", "{% for m in (xs) if m %}{{ m }}{% endfor %}", false},
		{"data only", "text (a if b else c) outside tags", false},
		{"string only", `{{ "(a if b else c)" }}`, false},
		{"unbalanced", "{{ (a if b else c }}", false},
		{"mismatched", "{{ (a if b else c] }}", false},
		{"paren", "{{ (a if b else c) }}", true},
		{"multi-line", "{{ {\n  'k': a if b else c,\n  'j': 1\n} }}\n{{ d }}", true},
		{"crlf", "{{ x }}\r\n{{ (a if b else c) }}", true},
	}
	for _, c := range cases {
		got := rewriteConditionals(c.src, templateConfig())
		if changed := got != c.src; changed != c.changed {
			t.Errorf("%s: changed=%v, want %v: %q", c.name, changed, c.changed, got)
		}
		src := strings.ReplaceAll(c.src, "\r\n", "\n")
		if c.changed && strings.Count(got, "\n") != strings.Count(src, "\n") {
			t.Errorf("%s: %q has other lines than %q: error positions would move", c.name, got, src)
		}
	}
}
