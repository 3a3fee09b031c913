package tokenizer

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Limits on one chat-template rendering. Chat templates come with
// checkpoints downloaded from strangers, and messages come from clients, so
// a rendering may neither read files nor run or grow without bound.
const (
	// MaxTemplateSteps is how many loop iterations and macro calls one
	// rendering may run (range() items count too).
	MaxTemplateSteps = 1 << 18
	// MaxTemplateTime is how long one rendering may run.
	MaxTemplateTime = 2 * time.Second
	// MaxTemplateOutput is the most bytes one rendering may produce.
	MaxTemplateOutput = 32 << 20
	// maxTemplateDepth bounds nested macro calls and recursive loops, so a
	// template that recurses forever fails before the goroutine's stack
	// does (a stack overflow is fatal, not a recoverable panic).
	maxTemplateDepth = 256
)

// budgetVar names the per-rendering budget in the template context. It is
// not a valid identifier, so a template cannot reach it.
const budgetVar = "\x00budget"

// renderBudget counts one rendering's steps and time.
type renderBudget struct {
	steps    int
	depth    int
	deadline time.Time
}

func newRenderBudget() *renderBudget {
	return &renderBudget{deadline: time.Now().Add(MaxTemplateTime)}
}

// errBudget ends a rendering that ran out of steps, time or output.
var errBudget = errors.New("template limit")

func (b *renderBudget) spend(n int) error {
	b.steps += n
	if b.steps > MaxTemplateSteps {
		return fmt.Errorf("%w: more than %d loop iterations and macro calls", errBudget, MaxTemplateSteps)
	}
	if b.steps&0xff == 0 && time.Now().After(b.deadline) {
		return fmt.Errorf("%w: rendering took longer than %s", errBudget, MaxTemplateTime)
	}
	return nil
}

func budgetOf(ctx *exec.Context) *renderBudget {
	v, _ := ctx.Get(budgetVar)
	b, _ := v.(*renderBudget)
	return b
}

// stepNode is put at the start of every loop body and macro body: it runs
// once per iteration or call and charges the rendering's budget. When
// enter is set it also raises the nesting depth, and a sibling at the end
// of the body lowers it again.
type stepNode struct {
	loc   nodes.Node
	enter bool
	leave bool
}

func (s *stepNode) Position() *tokens.Token { return s.loc.Position() }
func (s *stepNode) String() string          { return "step" }

func (s *stepNode) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	b := budgetOf(r.Environment.Context)
	if b == nil {
		return errors.New("template rendered without a budget")
	}
	switch {
	case s.leave:
		b.depth--
		return nil
	case s.enter:
		b.depth++
		if b.depth > maxTemplateDepth {
			return fmt.Errorf("%w: macro calls or recursive loops nested deeper than %d", errBudget, maxTemplateDepth)
		}
	}
	return b.spend(1)
}

// guard wraps w's nodes between a step node and, for nested bodies, a
// node that undoes the depth. A body left early (an error, a break) skips
// the closing node; the rendering then fails or the loop ends, and depth
// is only ever overcounted, never undercounted.
func guard(w *nodes.Wrapper, nested bool) {
	if w == nil {
		return
	}
	var loc nodes.Node = w
	open := &nodes.ControlStructureBlock{Location: w.Location, Name: "step", ControlStructure: &stepNode{loc: loc, enter: nested}}
	body := append([]nodes.Node{open}, w.Nodes...)
	if nested {
		body = append(body, &nodes.ControlStructureBlock{Location: w.Location, Name: "step", ControlStructure: &stepNode{loc: loc, leave: true}})
	}
	w.Nodes = body
}

// guarded wraps a control structure's parser so that the bodies it parses
// (loop bodies, macro bodies) charge the rendering's budget.
func guarded(parse parser.ControlStructureParser) parser.ControlStructureParser {
	return func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
		cs, err := parse(p, args)
		if err != nil {
			return nil, err
		}
		switch cs := cs.(type) {
		case *controlStructures.ForControlStructure:
			guard(cs.BodyWrapper, cs.Recursive)
		case *controlStructures.MacroControlStructure:
			guard(cs.Wrapper, true)
		}
		return cs, nil
	}
}

// restrictStatements makes a statement set safe for untrusted templates:
// loops and macros are budgeted, file access is refused.
func restrictStatements(set *exec.ControlStructureSet) {
	for _, name := range []string{"for", "macro"} {
		if parse, ok := set.Get(name); ok {
			_ = set.Replace(name, guarded(parse))
		}
	}
	for _, name := range []string{"include", "import", "from", "extends"} {
		_ = set.Replace(name, refuseFileAccess(name))
	}
}

// refuseFileAccess replaces include, import, from and extends: a chat
// template renders from its own text only.
func refuseFileAccess(name string) parser.ControlStructureParser {
	return func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
		return nil, args.Error(fmt.Sprintf("{%% %s %%} is not allowed: chat templates cannot read other templates or files", name), nil)
	}
}

// limitedWriter fails writes past the output limit.
type limitedWriter struct {
	w    io.Writer
	left int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if len(p) > l.left {
		return 0, fmt.Errorf("%w: output larger than %d bytes", errBudget, MaxTemplateOutput)
	}
	l.left -= len(p)
	return l.w.Write(p)
}

// limitReason says which limit a rendering hit, without the chain of
// gonja's wrapping (one level per nested call), or shortens err's message.
func limitReason(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, errBudget.Error()+": "); i >= 0 {
		return msg[i:]
	}
	if len(msg) > 1024 {
		return msg[:1024] + "..."
	}
	return msg
}

// checkTemplateSource refuses template text that gonja's lexer is not to
// be trusted with: a non-ASCII character inside a tag ({{ }}, {% %}) but
// outside a string literal. Jinja names and operators are ASCII, so such a
// template is wrong in any case, and some of these (found by fuzzing) make
// the lexer loop forever, which no limit inside a rendering could stop.
func checkTemplateSource(src string) error {
	for i := 0; i < len(src); {
		j := strings.Index(src[i:], "{")
		if j < 0 || i+j+1 >= len(src) {
			return nil
		}
		i += j + 1
		var closing string
		switch src[i] {
		case '#':
			end := strings.Index(src[i:], "#}")
			if end < 0 {
				return nil
			}
			i += end + 2
			continue
		case '{':
			closing = "}}"
		case '%':
			closing = "%}"
		default:
			continue
		}
		start := i + 1
		end, err := scanTag(src, start, closing)
		if err != nil {
			return err
		}
		i = end
		if closing == "%}" && strings.Trim(src[start:max(start, end-2)], " \t\r\n-+") == "raw" {
			k := strings.Index(src[i:], "endraw")
			if k < 0 {
				return nil
			}
			i += k + len("endraw")
		}
	}
	return nil
}

// scanTag finds the end of the tag whose body starts at i (the index just
// past closing), refusing non-ASCII outside string literals.
func scanTag(src string, i int, closing string) (int, error) {
	var quote byte
	for i < len(src) {
		c := src[i]
		switch {
		case quote != 0 && c == '\\':
			i += 2
			continue
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case strings.HasPrefix(src[i:], closing):
			return i + len(closing), nil
		case c >= 0x80:
			return 0, fmt.Errorf("non-ASCII character at byte %d inside a tag, outside a string literal", i)
		}
		i++
	}
	return len(src), nil
}
