package toolcall

import (
	"strings"

	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

// Reasoning models (Qwen3, QwQ, DeepSeek-R1 and its distills) think in a
// <think>…</think> block before they answer. It lives here beside the
// tool-call syntax because both are how a family writes structure into its
// generated text; a reply's content is what tool calls are parsed from.
const (
	// ThinkOpen opens a reasoning block.
	ThinkOpen = "<think>"
	// ThinkClose ends a reasoning block.
	ThinkClose = "</think>"
)

// DetectReasoning reports whether the tokenizer's default chat template
// writes reasoning blocks (it mentions <think>).
func DetectReasoning(tok *tokenizer.Tokenizer) bool {
	src, err := tok.ChatTemplate("")
	return err == nil && strings.Contains(src, ThinkOpen)
}

// ReasoningOpen reports whether a rendered prompt ends inside a reasoning
// block: its last <think> is not closed, as DeepSeek-R1's template and
// Qwen3 thinking models' leave it, so the reply begins with reasoning and
// has no <think> of its own. (Qwen3 with enable_thinking false closes the
// block in the prompt: the reply is all content.)
func ReasoningOpen(prompt string) bool {
	i := strings.LastIndex(prompt, ThinkOpen)
	return i >= 0 && !strings.Contains(prompt[i:], ThinkClose)
}

// ReasoningParser splits a reply's text into reasoning and content as it
// streams, as vLLM's and SGLang's qwen3 and deepseek_r1 reasoning parsers
// do: the text of a <think>…</think> block at the start of the reply is
// reasoning, the tags are dropped, and everything after </think> is
// content, exactly as generated (the whitespace after the tag included).
// A reply that does not begin with <think> (leading whitespace aside) is
// all content, unless the prompt opened the block: then it is reasoning up
// to </think>, or to its end when generation stopped first. Tags split
// across pieces are held back until they are complete or ruled out.
//
// The zero value expects the reply to open its own block. A parser is not
// safe for concurrent use.
type ReasoningParser struct {
	state reasoningState
	held  string // text that may begin a tag, not yet returned
}

type reasoningState uint8

const (
	atStart   reasoningState = iota // nothing decided: <think> may come
	atStartIn                       // the prompt opened the block; a leading <think> is dropped
	inside                          // reasoning until </think>
	after                           // content to the end
)

// NewReasoningParser returns a parser for a reply whose prompt opened the
// reasoning block (open; see ReasoningOpen) or not.
func NewReasoningParser(open bool) *ReasoningParser {
	if open {
		return &ReasoningParser{state: atStartIn}
	}
	return &ReasoningParser{}
}

// Feed takes the next piece of the reply and returns the reasoning and
// the content it completes; either may be empty while text is held back.
func (p *ReasoningParser) Feed(piece string) (reasoning, content string) {
	text := p.held + piece
	p.held = ""
	switch p.state {
	case atStart, atStartIn:
		return p.start(text)
	case inside:
		return p.reason(text)
	}
	return "", text
}

// start decides how the reply begins: with <think> (after whitespace), or
// not, in which case it is content, or reasoning when the prompt opened the
// block.
func (p *ReasoningParser) start(text string) (string, string) {
	trimmed := strings.TrimLeft(text, " \t\r\n")
	switch {
	case strings.HasPrefix(trimmed, ThinkOpen):
		p.state = inside
		return p.reason(trimmed[len(ThinkOpen):])
	case strings.HasPrefix(ThinkOpen, trimmed):
		p.held = text // whitespace, or part of the tag: wait
		return "", ""
	case p.state == atStartIn:
		p.state = inside
		return p.reason(text)
	}
	p.state = after
	return "", text
}

// reason returns text as reasoning up to </think>, holding back a suffix
// that may begin the tag.
func (p *ReasoningParser) reason(text string) (string, string) {
	if i := strings.Index(text, ThinkClose); i >= 0 {
		p.state = after
		return text[:i], text[i+len(ThinkClose):]
	}
	for j := max(0, len(text)-len(ThinkClose)+1); j < len(text); j++ {
		if strings.HasPrefix(ThinkClose, text[j:]) {
			p.held = text[j:]
			return text[:j], ""
		}
	}
	return text, ""
}

// Flush returns the text held back at the end of the reply: a partial
// tag, or leading whitespace, is what it would have been had the tag not
// come.
func (p *ReasoningParser) Flush() (reasoning, content string) {
	held := p.held
	p.held = ""
	switch p.state {
	case inside, atStartIn:
		return held, ""
	}
	return "", held
}

// SplitReasoning splits a whole reply as a ReasoningParser fed it in one
// piece would.
func SplitReasoning(text string, open bool) (reasoning, content string) {
	p := NewReasoningParser(open)
	r, c := p.Feed(text)
	fr, fc := p.Flush()
	return r + fr, c + fc
}
