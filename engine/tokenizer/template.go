package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
	"github.com/nikolalohinski/gonja/v2/parser"
)

// Message is one chat message as chat templates see it; the type lives
// in api so a chat request carries it without importing the tokenizer.
// Empty optional fields are left out of the template's message object, as
// a Python caller that omits the key would.
type Message = api.Message

// ChatOptions control ApplyChatTemplate. The zero value renders the
// default template without a generation prompt.
type ChatOptions struct {
	// AddGenerationPrompt appends the assistant turn's opening.
	AddGenerationPrompt bool
	// Tools are OpenAI-shaped tool definitions, passed as "tools" when
	// non-nil. Go maps render their keys in sorted order.
	Tools []map[string]any
	// TemplateName picks a named template from a template list; "" picks
	// the one named "default" (or the only one).
	TemplateName string
	// Extra holds further template variables (e.g. "enable_thinking");
	// they override the standard ones.
	Extra map[string]any
	// Now is the time strftime_now reports; zero means the current time.
	Now time.Time
}

// chatTemplates holds a tokenizer_config.json's templates, compiled.
type chatTemplates struct {
	file     string // tokenizer_config.json's path, for errors
	env      *exec.Environment
	sources  map[string]string
	compiled map[string]*exec.Template
	errs     map[string]error
}

const defaultTemplateName = "default"

// parseChatTemplates reads chat_template: a string or a list of
// {"name", "template"}. Templates that fail to parse are kept with their
// error, which ApplyChatTemplate returns.
func parseChatTemplates(raw json.RawMessage, file string) (*chatTemplates, error) {
	if isNull(raw) {
		return nil, nil
	}
	sources := map[string]string{}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		sources[defaultTemplateName] = one
	} else {
		var list []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, specErr("chat_template", ErrMalformed, "neither a string nor a list of {name, template}")
		}
		for i, item := range list {
			if item.Name == "" {
				return nil, specErr(fmt.Sprintf("chat_template[%d]", i), ErrMalformed, "template without a name")
			}
			sources[item.Name] = item.Template
		}
	}
	ct := &chatTemplates{file: file, env: newTemplateEnv(), sources: sources,
		compiled: map[string]*exec.Template{}, errs: map[string]error{}}
	for name, src := range sources {
		tpl, err := ct.compile(name, src)
		if err != nil {
			ct.errs[name] = err
			continue
		}
		ct.compiled[name] = tpl
	}
	return ct, nil
}

// templateConfig is Hugging Face's Jinja2 set-up: trim_blocks and
// lstrip_blocks, no trailing-newline keeping, no autoescape.
func templateConfig() *config.Config {
	c := config.New()
	c.TrimBlocks = true
	c.LeftStripBlocks = true
	return c
}

func (ct *chatTemplates) compile(name, src string) (tpl *exec.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			tpl, err = nil, &TemplateError{File: ct.file, Name: name, Reason: fmt.Sprintf("parse: %v", r)}
		}
	}()
	if err := checkTemplateSource(src); err != nil {
		return nil, &TemplateError{File: ct.file, Name: name, Reason: "parse: " + err.Error()}
	}
	src = rewriteConditionals(src, templateConfig())
	// A memory loader holding only this template: include/extends/import
	// cannot reach the file system.
	loader, lerr := loaders.NewMemoryLoader(map[string]string{"/" + name: src})
	if lerr != nil {
		return nil, &TemplateError{File: ct.file, Name: name, Reason: lerr.Error()}
	}
	tpl, err = exec.NewTemplate("/"+name, templateConfig(), loader, ct.env)
	if err != nil {
		return nil, &TemplateError{File: ct.file, Name: name, Reason: "parse: " + trimSource(err.Error(), src)}
	}
	return tpl, nil
}

// trimSource drops the template source gonja quotes in parse errors.
func trimSource(msg, src string) string {
	return strings.ReplaceAll(msg, src, "<template>")
}

// newTemplateEnv builds a sandboxed environment of its own: copies of the
// built-in filters, tests and statements (so nothing global is changed),
// Python-compatible tojson, and the globals Hugging Face templates use.
func newTemplateEnv() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	_ = filters.Replace("tojson", filterPyToJSON)
	_ = filters.Replace("items", filterItems)
	tests := exec.NewTestSet(map[string]exec.TestFunction{}).Update(builtins.Tests)
	statements := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{}).Update(builtins.ControlStructures)
	_ = statements.Register("generation", parseGeneration)
	restrictStatements(statements)
	globals := exec.NewContext(map[string]any{})
	for _, name := range []string{"namespace", "dict", "cycler", "joiner"} {
		if fn, ok := builtins.GlobalFunctions.Get(name); ok {
			globals.Set(name, fn)
		}
	}
	globals.Set("range", rangeFunction)
	globals.Set("raise_exception", raiseException)
	return &exec.Environment{
		Filters: filters, Tests: tests, ControlStructures: statements,
		Context: globals, Methods: templateMethods(),
	}
}

// HasChatTemplate reports whether tokenizer_config.json holds a chat
// template.
func (t *Tokenizer) HasChatTemplate() bool {
	return t.templates != nil && len(t.templates.sources) > 0
}

// TemplateNames lists the chat templates by name ("default" for a single
// template).
func (t *Tokenizer) TemplateNames() []string {
	if t.templates == nil {
		return nil
	}
	return sortedKeys(t.templates.sources)
}

// ChatTemplate returns the source of the chat template named name ("" for
// the default one, as ChatOptions.TemplateName), or ErrNoChatTemplate.
func (t *Tokenizer) ChatTemplate(name string) (string, error) {
	name, err := t.templateName(name)
	if err != nil {
		return "", err
	}
	return t.templates.sources[name], nil
}

// IsTemplateVariable reports whether name is one of the variables
// ApplyChatTemplate itself passes to every template (messages, tools,
// add_generation_prompt, bos_token, eos_token, raise_exception,
// strftime_now, range and the Jinja2 globals), which ChatOptions.Extra would
// override.
func IsTemplateVariable(name string) bool {
	switch name {
	case "messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "strftime_now",
		"raise_exception", "range", "namespace", "dict", "cycler", "joiner":
		return true
	}
	return false
}

// ApplyChatTemplate renders messages with the chat template as Hugging
// Face's transformers does (Jinja2 with trim_blocks and lstrip_blocks).
// The template sees messages, add_generation_prompt, bos_token, eos_token,
// tools (when set), the functions raise_exception and strftime_now, and
// opts.Extra. Errors: ErrNoChatTemplate, or a *TemplateError (wrapping
// ErrTemplate) when the template fails to parse, raises, or misuses an
// undefined value.
func (t *Tokenizer) ApplyChatTemplate(messages []Message, opts ChatOptions) (string, error) {
	name, err := t.templateName(opts.TemplateName)
	if err != nil {
		return "", err
	}
	if err := t.templates.errs[name]; err != nil {
		return "", err
	}
	tpl := t.templates.compiled[name]
	vars := t.templateVars(messages, &opts)
	vars[budgetVar] = newRenderBudget()
	ctx := exec.NewContext(vars)
	return t.templates.render(tpl, ctx, name)
}

func (t *Tokenizer) templateName(want string) (string, error) {
	if !t.HasChatTemplate() {
		return "", ErrNoChatTemplate
	}
	src := t.templates.sources
	if want == "" {
		if _, ok := src[defaultTemplateName]; ok {
			return defaultTemplateName, nil
		}
		if len(src) == 1 {
			for name := range src {
				return name, nil
			}
		}
		return "", fmt.Errorf("%w: no template named %q among %v", ErrNoChatTemplate, defaultTemplateName, sortedKeys(src))
	}
	if _, ok := src[want]; !ok {
		return "", fmt.Errorf("%w: no template named %q among %v", ErrNoChatTemplate, want, sortedKeys(src))
	}
	return want, nil
}

func (t *Tokenizer) templateVars(messages []Message, opts *ChatOptions) map[string]any {
	msgs := make(pyList, len(messages))
	for i, m := range messages {
		obj := map[string]any{"role": m.Role, "content": m.Content}
		if m.Name != "" {
			obj["name"] = m.Name
		}
		if m.ToolCalls != nil {
			obj["tool_calls"] = pyData(m.ToolCalls)
		}
		if m.ToolCallID != "" {
			obj["tool_call_id"] = m.ToolCallID
		}
		msgs[i] = obj
	}
	now := opts.Now
	vars := map[string]any{
		"messages":              msgs,
		"add_generation_prompt": opts.AddGenerationPrompt,
		"bos_token":             t.bosText,
		"eos_token":             t.eosText,
		"strftime_now": func(_ *exec.Evaluator, params *exec.VarArgs) (string, error) {
			if now.IsZero() {
				now = time.Now()
			}
			return strftime(now, params.First().String()), nil
		},
	}
	if opts.Tools != nil {
		vars["tools"] = pyData(opts.Tools)
	}
	for k, v := range opts.Extra {
		vars[k] = pyData(v)
	}
	return vars
}

// render executes tpl, turning errors and panics inside gonja into
// *TemplateError values.
func (ct *chatTemplates) render(tpl *exec.Template, ctx *exec.Context, name string) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", &TemplateError{File: ct.file, Name: name, Reason: fmt.Sprintf("render: %v", r)}
		}
	}()
	var sb strings.Builder
	if err := tpl.Execute(&limitedWriter{w: &sb, left: MaxTemplateOutput}, ctx); err != nil {
		var raised *raisedError
		if errors.As(err, &raised) {
			return "", &TemplateError{File: ct.file, Name: name, Reason: "raise_exception: " + raised.msg}
		}
		return "", &TemplateError{File: ct.file, Name: name, Reason: limitReason(err)}
	}
	return sb.String(), nil
}

// raisedError carries raise_exception's message through gonja.
type raisedError struct{ msg string }

func (e *raisedError) Error() string { return e.msg }

func raiseException(_ *exec.Evaluator, params *exec.VarArgs) (string, error) {
	return "", &raisedError{msg: params.First().String()}
}

// rangeFunction is Python's range returning a list (gonja's own feeds a
// channel from a goroutine that leaks when a loop breaks early). Its items
// count against the rendering's step budget.
func rangeFunction(e *exec.Evaluator, params *exec.VarArgs) ([]int, error) {
	args := make([]int, len(params.Args))
	for i, a := range params.Args {
		if !a.IsInteger() {
			return nil, fmt.Errorf("range: argument %d is not an integer", i+1)
		}
		args[i] = a.Integer()
	}
	start, stop, step := 0, 0, 1
	switch len(args) {
	case 1:
		stop = args[0]
	case 2:
		start, stop = args[0], args[1]
	case 3:
		start, stop, step = args[0], args[1], args[2]
	default:
		return nil, fmt.Errorf("range expects 1 to 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return nil, errors.New("range: step must not be zero")
	}
	n := 0
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && start > stop {
		n = (start - stop - step - 1) / -step
	}
	if n > 1<<20 {
		return nil, fmt.Errorf("range: %d items; at most 1048576", n)
	}
	if b := budgetOf(e.Environment.Context); b != nil {
		if err := b.spend(n); err != nil {
			return nil, err
		}
	}
	out := make([]int, 0, n)
	for i := start; len(out) < n; i += step {
		out = append(out, i)
	}
	return out, nil
}
