package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/testmodel"
)

// hangAfter is how long a rendering may take before a test calls it a
// hang. It is a hang detector, far above MaxTemplateTime, not a speed
// check (the race detector and a loaded machine slow renderings down).
const hangAfter = 30 * time.Second

// withTemplate returns the test model's tokenizer with tpl as its chat
// template.
func withTemplate(t testing.TB, tpl string) *Tokenizer {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	readJSON(t, filepath.Join(dir, "tokenizer_config.json"), &cfg)
	cfg["chat_template"] = tpl
	cj, _ := json.Marshal(cfg)
	tok, err := FromJSON(tj, cj)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestHostileTemplates: templates that try to read files, loop or recurse
// without bound, or blow up their output fail with a *TemplateError, fast,
// and the process survives.
func TestHostileTemplates(t *testing.T) {
	cases := []struct{ name, tpl, want string }{
		{"include", `{% include "default" %}`, "not allowed"},
		{"include a file", `{% include "/etc/passwd" %}`, "not allowed"},
		{"import", `{% import "default" as m %}{{ m }}`, "not allowed"},
		{"from import", `{% from "default" import x %}`, "not allowed"},
		{"extends", `{% extends "default" %}`, "not allowed"},
		{"nested loops", `{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}`, "template limit"},
		{"loops over messages", `{% for a in messages %}{% for b in range(1000000) %}{% for c in range(1000000) %}{% endfor %}{% endfor %}{% endfor %}`, "template limit"},
		{"recursive macro", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "deeper than"},
		{"mutual recursion", `{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}`, "deeper than"},
		{"recursive loop", `{% set x = [[1]] %}{% for i in x recursive %}{{ loop(x) }}{% endfor %}`, "deeper than"},
		{"output bomb", `{% for i in range(40) %}{{ 'x' * 1000000 }}{% endfor %}`, "output larger"},
		{"lexer loop (found by fuzzing)", "{%\ufffd0.\ufffd", "non-ASCII"},
		{"non-ASCII name", "{{ messagé }}", "non-ASCII"},
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tok := withTemplate(t, c.tpl)
			start := time.Now()
			out, err := tok.ApplyChatTemplate(msgs, ChatOptions{})
			var te *TemplateError
			if !errors.As(err, &te) || !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %d bytes, error %v; want a TemplateError saying %q", len(out), err, c.want)
			}
			if d := time.Since(start); d > hangAfter {
				t.Errorf("took %s", d)
			}
		})
	}
	// Non-ASCII text, strings, comments and raw blocks are fine.
	ok := withTemplate(t, "héllo {# ça #}{{ '—' }}{% if messages[0].content != \"é\" %}ok{% endif %}{% raw %}{{ é }}{% endraw %}")
	if out, err := ok.ApplyChatTemplate(msgs, ChatOptions{}); err != nil || out != "héllo —ok{{ é }}" {
		t.Fatalf("non-ASCII outside tags: %q, %v", out, err)
	}
	// The limits leave room for real work: a long conversation renders.
	long := make([]Message, 5000)
	for i := range long {
		long[i] = Message{Role: []string{"user", "assistant"}[i%2], Content: strings.Repeat("word ", 20)}
	}
	tok := withTemplate(t, `{% for m in messages %}{% if m.role == 'user' %}U{% else %}A{% endif %}: {{ m.content }}{% endfor %}`)
	if out, err := tok.ApplyChatTemplate(long, ChatOptions{}); err != nil || len(out) < 5000*100 {
		t.Fatalf("long conversation: %d bytes, %v", len(out), err)
	}
}

// TestOversizedFiles: files larger than any real tokenizer are refused
// without being read (the sparse file below would take 200 MB), as are
// non-regular files.
func TestOversizedFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokenizer.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxTokenizerJSONBytes + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var fe *FileError
	if _, err := Load(dir); !errors.As(err, &fe) || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized tokenizer.json: %v", err)
	}
	if err := os.WriteFile(path, mustJSON(t, tinySpec()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tokenizer_config.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); !errors.As(err, &fe) || !errors.Is(err, ErrMalformed) {
		t.Fatalf("directory as tokenizer_config.json: %v", err)
	}
}
