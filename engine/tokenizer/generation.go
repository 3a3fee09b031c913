package tokenizer

import (
	"fmt"
	"io"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// generationBlock is transformers' {% generation %}...{% endgeneration %}
// (its AssistantTracker extension): it marks the assistant's part of the
// rendering for training masks and otherwise renders its body unchanged,
// which is all serving needs.
type generationBlock struct {
	position *tokens.Token
	body     *nodes.Wrapper
}

func (g *generationBlock) Position() *tokens.Token { return g.position }

func (g *generationBlock) String() string {
	return fmt.Sprintf("GenerationControlStructure(Line=%d Col=%d)", g.position.Line, g.position.Col)
}

// Execute renders the body in a scope of its own, as Jinja2's call block
// under the extension does.
func (g *generationBlock) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	var out strings.Builder
	sub := r.Inherit()
	sub.Output = &out
	if err := sub.ExecuteWrapper(g.body); err != nil {
		return err
	}
	_, err := io.WriteString(r.Output, out.String())
	return err
}

func parseGeneration(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	g := &generationBlock{position: p.Current()}
	body, _, err := p.WrapUntil("endgeneration")
	if err != nil {
		return nil, err
	}
	if !args.End() {
		return nil, args.Error("generation takes no arguments", nil)
	}
	g.body = body
	return g, nil
}
