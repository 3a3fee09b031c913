package tokenizer

import (
	"strings"

	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// gonja parses Jinja's conditional expression (x if c else y) only as the
// whole of an output tag or of a set statement; inside brackets, as in
// Gemma 3's '<start_of_turn>' + role + (prefix if loop.first else ""), it
// reports "Unbalanced parenthesis". rewriteConditionals turns each
// conditional expression inside (), [] or {} into an equivalent that gonja
// parses:
//
//	(x if c else y)  ->  (((c) and [x] or [y])[0])
//
// Jinja's and/or return an operand (gonja's too), and a one-item list is
// true whatever its item, so the result is x when c is true and y
// otherwise, and only the chosen branch is evaluated, as in Jinja. Without
// else, y is a name no template defines: undefined, as in Jinja.

// undefinedName stands for the missing else branch of x if c.
const undefinedName = "__mlxserving_undefined__"

// rewriteConditionals returns src with its bracketed conditional
// expressions rewritten; src itself when it holds none or when its tags do
// not lex into balanced brackets (gonja then reports the error itself).
func rewriteConditionals(src string, cfg *config.Config) string {
	if !strings.Contains(src, "if") {
		return src
	}
	norm := strings.ReplaceAll(strings.ReplaceAll(src, "\r\n", "\n"), "\r", "\n")
	r, ok := newCondRewriter(norm, cfg)
	if !ok || !r.found {
		return src
	}
	return r.text(0, len(r.toks)-1)
}

// condRewriter holds one template's tokens (whitespace left out, the
// final EOF kept, so every token has a successor) and the index of each
// bracket's partner.
type condRewriter struct {
	src   string
	toks  []*tokens.Token
	match []int // match[i]: the closing bracket of an opening one at i
	found bool  // some bracket holds a conditional
}

func newCondRewriter(src string, cfg *config.Config) (*condRewriter, bool) {
	stream := tokens.LexAll(src, cfg)
	r := &condRewriter{src: src}
	for !stream.End() {
		r.toks = append(r.toks, stream.Next())
	}
	if stream.Current().Type != tokens.EOF {
		return nil, false
	}
	r.toks = append(r.toks, stream.Current())
	return r, r.pair()
}

// pair matches brackets within each tag and notes whether any bracket
// holds an if at its own depth.
func (r *condRewriter) pair() bool {
	r.match = make([]int, len(r.toks))
	var open []int
	for i, tok := range r.toks {
		switch tok.Type {
		case tokens.LeftParenthesis, tokens.LeftBracket, tokens.LeftBrace:
			open = append(open, i)
		case tokens.RightParenthesis, tokens.RightBracket, tokens.RightBrace:
			if len(open) == 0 || !closes(r.toks[open[len(open)-1]].Type, tok.Type) {
				return false
			}
			r.match[open[len(open)-1]] = i
			open = open[:len(open)-1]
		case tokens.VariableEnd, tokens.BlockEnd, tokens.EOF:
			if len(open) > 0 {
				return false
			}
		case tokens.Name:
			r.found = r.found || len(open) > 0 && tok.Val == "if"
		}
	}
	return true
}

func closes(open, close tokens.Type) bool {
	switch open {
	case tokens.LeftParenthesis:
		return close == tokens.RightParenthesis
	case tokens.LeftBracket:
		return close == tokens.RightBracket
	}
	return close == tokens.RightBrace
}

func isOpen(t tokens.Type) bool {
	return t == tokens.LeftParenthesis || t == tokens.LeftBracket || t == tokens.LeftBrace
}

// text renders the source from token a up to token b (exclusive), with
// every bracket group in between rewritten.
func (r *condRewriter) text(a, b int) string {
	var sb strings.Builder
	cursor := r.toks[a].Pos
	for i := a; i < b; i++ {
		if !isOpen(r.toks[i].Type) {
			continue
		}
		j := r.match[i]
		sb.WriteString(r.src[cursor : r.toks[i].Pos+1])
		sb.WriteString(r.group(i+1, j))
		cursor, i = r.toks[j].Pos, j-1
	}
	sb.WriteString(r.src[cursor:r.toks[b].Pos])
	return sb.String()
}

// group renders the inside of a bracket (tokens a to b, exclusive): its
// items, separated by commas or colons, each rewritten.
func (r *condRewriter) group(a, b int) string {
	var sb strings.Builder
	sb.WriteString(r.src[r.toks[a-1].Pos+1 : r.toks[a].Pos])
	start := a
	for i := a; i <= b; i++ {
		if i < b && isOpen(r.toks[i].Type) {
			i = r.match[i]
			continue
		}
		if i < b && r.toks[i].Type != tokens.Comma && r.toks[i].Type != tokens.Colon {
			continue
		}
		if start < i {
			sb.WriteString(r.item(start, i))
		}
		if i < b {
			sb.WriteString(r.src[r.toks[i].Pos:r.toks[i+1].Pos]) // the separator and the space after it
		}
		start = i + 1
	}
	return sb.String()
}

// item renders one expression (tokens a to b, exclusive), as a
// conditional's equivalent when it has an if at its own depth.
func (r *condRewriter) item(a, b int) string {
	ifAt, elseAt := -1, -1
	for i := a; i < b; i++ {
		switch {
		case isOpen(r.toks[i].Type):
			i = r.match[i]
		case r.toks[i].Type != tokens.Name:
		case ifAt < 0 && r.toks[i].Val == "if":
			ifAt = i
		case ifAt >= 0 && r.toks[i].Val == "else":
			elseAt = i
		}
		if elseAt >= 0 {
			break
		}
	}
	if ifAt < 0 {
		return r.text(a, b)
	}
	cond, alt := "", undefinedName
	if elseAt < 0 {
		cond = r.text(ifAt+1, b)
	} else {
		// x if c else y if d else z: the else branch is a conditional itself.
		cond, alt = r.text(ifAt+1, elseAt), r.item(elseAt+1, b)
	}
	return "(((" + cond + ") and [" + r.text(a, ifAt) + "] or [" + alt + "])[0])"
}
