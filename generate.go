package mlxserving

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/toolcall"
)

// Generate starts generating a completion and returns its stream. The
// request is validated and queued before Generate returns: bad input and a
// full queue are reported here, as typed errors. Cancelling ctx stops the
// generation and frees its KV within one engine step.
func (s *Server) Generate(ctx context.Context, req api.Request) (*api.Stream, error) {
	st, err := s.generate(ctx, req)
	if err != nil {
		s.metrics.refused(req.Model, req.Priority, err)
	}
	return st, err
}

func (s *Server) generate(ctx context.Context, req api.Request) (*api.Stream, error) {
	return s.startOn(ctx, &req.Model, &req.Adapter, req.KeepAlive, func(m *model) (*api.Stream, error) {
		return s.generateOn(ctx, m, req)
	})
}

// startOn resolves a request's model and adapter names (rewriting them
// in place: an adapter named as the model becomes its base and adapter),
// takes the model and starts the request on it with start, releasing the
// model where start refuses the request.
func (s *Server) startOn(ctx context.Context, name, adapter *string, keepAlive *time.Duration,
	start func(*model) (*api.Stream, error)) (*api.Stream, error) {
	var err error
	if *name, *adapter, err = s.resolveAdapter(*name, *adapter); err != nil {
		return nil, err
	}
	m, err := s.acquire(ctx, *name, keepAlive)
	if err != nil {
		return nil, err
	}
	st, err := start(m)
	if err != nil {
		s.release(m)
	}
	return st, err
}

func (s *Server) generateOn(ctx context.Context, m *model, req api.Request) (*api.Stream, error) {
	var err error
	prompt := req.PromptTokens
	if len(prompt) == 0 {
		if req.Prompt == "" {
			return nil, &engine.InvalidParamError{Param: "prompt", Reason: "prompt is empty"}
		}
		if m.tok == nil {
			return nil, fmt.Errorf("%w: model %q takes token ids (PromptTokens)", ErrNoTokenizer, req.Model)
		}
		if prompt, err = m.tok.Encode(req.Prompt, true); err != nil {
			return nil, &engine.InvalidParamError{Param: "prompt", Reason: err.Error(), Err: err}
		}
	}
	return s.submit(ctx, m, prompt, req.Params)
}

// Chat renders the conversation with the model's chat template (adding the
// generation prompt) and starts generating the assistant's reply.
func (s *Server) Chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error) {
	st, err := s.chat(ctx, req)
	if err != nil {
		s.metrics.refused(req.Model, req.Priority, err)
	}
	return st, err
}

func (s *Server) chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error) {
	return s.startOn(ctx, &req.Model, &req.Adapter, req.KeepAlive, func(m *model) (*api.Stream, error) {
		return s.chatOn(ctx, m, req)
	})
}

func (s *Server) chatOn(ctx context.Context, m *model, req api.ChatRequest) (*api.Stream, error) {
	if len(req.Messages) == 0 {
		return nil, &engine.InvalidParamError{Param: "messages", Reason: "no messages"}
	}
	if m.tok == nil || !m.tok.HasChatTemplate() {
		return nil, fmt.Errorf("%w: model %q has no chat template", ErrNoTokenizer, req.Model)
	}
	text, err := m.tok.ApplyChatTemplate(req.Messages, tokenizer.ChatOptions{AddGenerationPrompt: true, Tools: req.Tools, Extra: req.ChatTemplateKwargs})
	if err != nil {
		return nil, &engine.InvalidParamError{Param: "messages", Reason: err.Error(), Err: err}
	}
	format := toolcall.Detect(m.tok)
	p := req.Params
	if req.ForceTool != "" {
		if text, p, err = forceTool(text, format, req); err != nil {
			return nil, err
		}
	}
	// The template writes the special tokens (BOS) itself.
	prompt, err := m.tok.Encode(text, false)
	if err != nil {
		return nil, &engine.InvalidParamError{Param: "messages", Reason: err.Error(), Err: err}
	}
	hdr := api.Header{ToolFormat: string(format), ToolForced: req.ForceTool != ""}
	if req.ForceTool == "" && len(p.JSONSchema) == 0 && toolcall.DetectReasoning(m.tok) {
		hdr.Reasoning, hdr.ReasoningOpen = true, toolcall.ReasoningOpen(text)
	}
	st, err := s.submitHeader(ctx, m, prompt, p, hdr)
	if err != nil && req.ForceTool != "" {
		err = s.blameTool(m, req, err)
	}
	return st, err
}

// blameTool names the tool whose parameters made a forced call's schema
// fail to compile (tools[i].function.parameters, with the path inside
// them), instead of the internal schema the call was built into.
func (s *Server) blameTool(m *model, req api.ChatRequest, err error) error {
	var ip *engine.InvalidParamError
	if !errors.As(err, &ip) || ip.Param != "json_schema" {
		return err
	}
	for i, t := range req.ForceTools {
		if (req.ForceTool != "*" && t.Name != req.ForceTool) || len(t.Parameters) == 0 {
			continue
		}
		if _, cerr := m.constraint(t.Parameters, s.cfg.grammarLimits); errors.As(cerr, &ip) {
			return &engine.InvalidParamError{Param: fmt.Sprintf("tools[%d].function.parameters", i), Reason: ip.Reason, Err: ip.Err}
		}
	}
	return err
}

// forceTool opens the family's tool-call syntax after the generation
// prompt and constrains the reply to one call of the requested function.
func forceTool(text string, f toolcall.Format, req api.ChatRequest) (string, api.Params, error) {
	p := req.Params
	tools := make([]toolcall.Tool, len(req.ForceTools))
	for i, t := range req.ForceTools {
		tools[i] = toolcall.Tool{Name: t.Name, Parameters: t.Parameters}
	}
	name := req.ForceTool
	if name == "*" {
		name = ""
	}
	schema, err := f.Schema(tools, name)
	if err != nil {
		return "", p, &engine.InvalidParamError{Param: "tool_choice", Reason: err.Error()}
	}
	p.JSONSchema = schema
	return text + f.Prefix(), p, nil
}

// submit validates the request against the model and queues it, or,
// with request merging on and a deterministic request, joins an identical
// generation or the response cache.
func (s *Server) submit(ctx context.Context, m *model, prompt []int32, p api.Params) (*api.Stream, error) {
	return s.submitHeader(ctx, m, prompt, p, api.Header{})
}

// submitHeader is submit with header fields for the stream (its Model is
// filled in here).
func (s *Server) submitHeader(ctx context.Context, m *model, prompt []int32, p api.Params, hdr api.Header) (*api.Stream, error) {
	if err := validate(m, prompt, &p); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stopTokens := p.StopTokens
	if !p.IgnoreEOS && len(m.eos) > 0 {
		// The tokenizer's end tokens stop generation like the engine's EOS.
		stopTokens = append(slices.Clone(p.StopTokens), m.eos...)
	}
	hdr.Model = m.info.ID
	if p.Adapter != "" { // the model the caller named
		hdr.Model = p.Adapter
	}
	if p.Session != "" || p.NewSession {
		sess, _, err := s.sessions.Begin(p.Session, hdr.Model)
		if err != nil {
			return nil, err
		}
		hdr.Session = sess.ID
	}
	// A named session keeps its own KV and is never merged; a minted one
	// may be (its next turn still finds the prefix through the index).
	if s.merger != nil && mergeable(&p) {
		return s.join(ctx, m, prompt, p, stopTokens, hdr)
	}
	p.Session = hdr.Session
	if len(p.Resume) == p.MaxTokens {
		// Every token reached the caller before the stream broke: only
		// its final chunk is left to send.
		return api.NewStream(ctx, newFinishedSource(s, m, len(prompt), len(p.Resume)), hdr), nil
	}
	src, err := s.start(ctx, m, prompt, p, stopTokens)
	if err != nil {
		return nil, err
	}
	return api.NewStream(ctx, src, hdr), nil
}

// start queues one sequence and returns its source, which ends the
// sequence when ctx ends.
func (s *Server) start(ctx context.Context, m *model, prompt []int32, p api.Params, stopTokens []int32) (*batcher.Source, error) {
	seq := &batcher.Sequence{
		Prompt:     prompt,
		MaxTokens:  p.MaxTokens,
		Params:     p.Sampling,
		StopTokens: stopTokens,
		IgnoreEOS:  p.IgnoreEOS,
		Adapter:    p.Adapter,
		Tier:       p.Priority,
		Submitted:  time.Now(),
	}
	s.sessionKeys(m, seq, p.Session)
	if m.tok != nil {
		seq.Text = m.tok.NewStreamDecoder(prompt, p.Stop)
	}
	if len(p.JSONSchema) > 0 {
		c, err := m.constraint(p.JSONSchema, s.cfg.grammarLimits)
		if err != nil {
			return nil, err
		}
		seq.Constraint = c
		seq.KeepCut = p.KeepCut
		if !p.KeepCut {
			if err := fitBudget(c, p.MaxTokens); err != nil {
				return nil, err
			}
		}
	}
	if err := resumeSequence(seq, p.Resume, m.info.EOS, m.batcher.JumpForward()); err != nil {
		return nil, err
	}
	// A resumed request's caller is waiting mid-stream: it goes ahead of
	// the rest of its tier.
	entry := &batcher.Entry{Value: seq, Tier: p.Priority, Client: p.Client, Cost: len(prompt) + p.MaxTokens, Urgent: len(p.Resume) > 0}
	if d := p.Deadlines.Or(s.requestDeadlines(ctx)); !d.Zero() {
		seq.Watch = retry.NewWatch(d, seq.Submitted, func(err *retry.DeadlineError) { batcher.Expire(m.queue, entry, err) })
	}
	if err := m.queue.Push(entry); err != nil {
		seq.Watch.Stop()
		return nil, err
	}
	release := sync.OnceFunc(func() { s.release(m) })
	go releaseWhenDone(release, seq.Done())
	hooks := batcher.SourceHooks{
		Gap:     func(gap time.Duration) { s.metrics.interToken(m.info.ID, gap) },
		Resumed: len(p.Resume),
		End: func(u *api.Usage, err error) {
			release()                                         // the reader seeing the end releases at once
			s.metrics.finished(m.info.ID, p.Priority, u, err) // the tier it was submitted at
		},
	}
	if m.tok != nil {
		hooks.TokenText = func(id int32) string { return string(m.tok.TokenBytes(id)) }
	}
	return batcher.NewSource(ctx, entry, m.queue, hooks), nil
}

// validate checks a request before it is queued, so a request that can
// never run is refused at once with the numbers that rule it out.
func validate(m *model, prompt []int32, p *api.Params) error {
	if len(prompt) == 0 {
		return &engine.InvalidParamError{Param: "prompt", Reason: "prompt is empty"}
	}
	if p.MaxTokens < 1 {
		return &engine.InvalidParamError{Param: "max_tokens", Reason: fmt.Sprintf("%d: must be at least 1", p.MaxTokens)}
	}
	if !p.Priority.Valid() {
		return &engine.InvalidParamError{Param: "priority", Reason: fmt.Sprintf("unknown tier %d", p.Priority)}
	}
	if err := p.Sampling.Validate(); err != nil {
		return err
	}
	if err := p.Deadlines.Validate(); err != nil {
		return &engine.InvalidParamError{Param: "deadlines", Reason: err.Error()}
	}
	if err := p.Sampling.CheckVocab(m.info.VocabSize); err != nil {
		return err
	}
	if len(p.Stop) > 0 && m.tok == nil {
		return fmt.Errorf("%w: stop strings need model %q's tokenizer; use StopTokens", ErrNoTokenizer, m.info.ID)
	}
	for _, stop := range p.Stop {
		if stop == "" {
			return &engine.InvalidParamError{Param: "stop", Reason: "empty stop string"}
		}
	}
	vocab := int32(m.info.VocabSize)
	for i, id := range prompt {
		if id < 0 || id >= vocab {
			return &engine.InvalidParamError{Param: "prompt", Reason: fmt.Sprintf("token %d at position %d is outside the vocabulary [0, %d)", id, i, vocab)}
		}
	}
	if len(p.Resume) > p.MaxTokens {
		return &engine.InvalidParamError{Param: "resume", Reason: fmt.Sprintf("%d tokens already delivered exceed max_tokens %d", len(p.Resume), p.MaxTokens)}
	}
	for i, id := range p.Resume {
		if id < 0 || id >= vocab {
			return &engine.InvalidParamError{Param: "resume", Reason: fmt.Sprintf("token %d at position %d is outside the vocabulary [0, %d)", id, i, vocab)}
		}
	}
	return scheduler.CheckFits(m.info.ID, len(prompt), p.MaxTokens, m.info.ContextLength, m.info.KVCapacity)
}
