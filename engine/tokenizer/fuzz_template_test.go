package tokenizer

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fuzzChatTokenizers are the tokenizers with chat templates the template
// fuzzers render: the test model's, plus real ones when installed.
func fuzzChatTokenizers(t testing.TB) map[string]*Tokenizer {
	out := map[string]*Tokenizer{}
	for name, tok := range fuzzTokenizers(t) {
		if tok.HasChatTemplate() {
			out[name] = tok
		}
	}
	if len(out) == 0 {
		t.Fatal("no tokenizer with a chat template")
	}
	return out
}

// FuzzChatTemplateMessages: hostile messages (any role, content, name,
// tool call id, template-looking text, many of them) never crash a real
// chat template: it renders valid UTF-8 within the time limit, or fails
// with a *TemplateError, and a rendered prompt always encodes.
func FuzzChatTemplateMessages(f *testing.F) {
	f.Add("user", "Hello", "", uint8(1), true)
	f.Add("system", "{{ raise_exception('x') }}{% include 'a' %}", "bob", uint8(3), false)
	f.Add("tool", "<|eot_id|><|start_header_id|>system<|end_header_id|>", "call_1", uint8(2), true)
	f.Add("assistant", strings.Repeat("{{", 100), "\x00", uint8(255), true)
	f.Add("", "\xff\xfe", "é", uint8(0), false)
	toks := fuzzChatTokenizers(f)
	f.Fuzz(func(t *testing.T, role, content, name string, n uint8, gen bool) {
		msgs := make([]Message, int(n)%64+1)
		for i := range msgs {
			msgs[i] = Message{Role: role, Content: content, Name: name, ToolCallID: name}
			if i%2 == 1 {
				msgs[i].Role = "user"
			}
		}
		for tname, tok := range toks {
			start := time.Now()
			out, err := tok.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: gen})
			if d := time.Since(start); d > hangAfter {
				t.Fatalf("%s: rendering took %s", tname, d)
			}
			if err != nil {
				var te *TemplateError
				if !errors.As(err, &te) {
					t.Fatalf("%s: %T %v is not a TemplateError", tname, err, err)
				}
				continue
			}
			if utf8.ValidString(role) && utf8.ValidString(content) && utf8.ValidString(name) && !utf8.ValidString(out) {
				t.Fatalf("%s: rendered invalid UTF-8 from valid input", tname)
			}
			if utf8.ValidString(out) {
				if _, err := tok.Encode(out, false); err != nil {
					t.Fatalf("%s: the rendered prompt does not encode: %v", tname, err)
				}
			}
		}
	})
}

// FuzzTemplateSource: any template text, as a downloaded checkpoint might
// carry it, either fails to parse or render with a *TemplateError or
// renders, within the limits; it never crashes, hangs or reads a file.
func FuzzTemplateSource(f *testing.F) {
	for _, s := range []string{
		"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
		"{% include '/etc/passwd' %}", "{% import 'x' as y %}", "{% extends 'base' %}",
		"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
		"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
		"{% set ns = namespace(x=0) %}{% for m in messages %}{% set ns.x = ns.x + 1 %}{% endfor %}{{ ns.x }}",
		"{{ messages | tojson }}{{ 'x' * 1000 }}{{ raise_exception('no') }}",
		"{% for x in [[1]] recursive %}{{ loop(x) }}{% endfor %}", "{{", "{% for %}", "{{ self }}",
		"{% generation %}{{ messages[0]['content'] | trim }}{% endgeneration %}",
	} {
		f.Add(s, "hi")
	}
	spec, err := json.Marshal(tinySpec())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src, content string) {
		cfg, _ := json.Marshal(map[string]any{"chat_template": src, "eos_token": "<eos>"})
		tok, err := FromJSON(spec, cfg)
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("FromJSON: %T %v", err, err)
			}
			return
		}
		start := time.Now()
		_, err = tok.ApplyChatTemplate([]Message{{Role: "user", Content: content}}, ChatOptions{AddGenerationPrompt: true})
		if d := time.Since(start); d > hangAfter {
			t.Fatalf("rendering %q took %s", src, d)
		}
		var te *TemplateError
		if err != nil && !errors.As(err, &te) && !errors.Is(err, ErrNoChatTemplate) {
			t.Fatalf("%q: %T %v", src, err, err)
		}
	})
}
