package compat_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

func newClient(base string) oai.Client {
	return oai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

func chatParams() oai.ChatCompletionNewParams {
	return oai.ChatCompletionNewParams{
		Model: "tiny",
		Messages: []oai.ChatCompletionMessageParamUnion{
			oai.SystemMessage("You are terse."),
			oai.UserMessage("Name a color."),
		},
		MaxTokens:   oai.Int(12),
		Temperature: oai.Float(0),
		Seed:        oai.Int(7),
	}
}

// TestGoSDKChat: non-streaming and streaming chat through openai-go give
// the same greedy text, with usage, and the stream's accumulated message
// is complete.
func TestGoSDKChat(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	ignoreEOS := option.WithJSONSet("ignore_eos", true)

	resp, err := client.Chat.Completions.New(ctx, chatParams(), ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Role != "assistant" || resp.Choices[0].FinishReason != "length" {
		t.Fatalf("response %s", resp.RawJSON())
	}
	if resp.Usage.CompletionTokens != 12 || resp.Usage.PromptTokens == 0 || !resp.Usage.PromptTokensDetails.JSON.CachedTokens.Valid() {
		t.Fatalf("usage %s", resp.Usage.RawJSON())
	}

	p := chatParams()
	p.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, p, ignoreEOS, option.WithHeader("X-Priority", "high"))
	var acc oai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		chunk := stream.Current()
		acc.AddChunk(chunk)
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if chunks < 12 {
		t.Fatalf("%d chunks for 12 tokens", chunks)
	}
	if got, want := acc.Choices[0].Message.Content, resp.Choices[0].Message.Content; got != want {
		t.Fatalf("streamed %q, non-streamed %q", got, want)
	}
	if acc.Usage.CompletionTokens != 12 || acc.Choices[0].FinishReason != "length" {
		t.Fatalf("stream usage %+v, finish %q", acc.Usage, acc.Choices[0].FinishReason)
	}
}

func TestGoSDKCompletionsAndModels(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	resp, err := client.Completions.New(ctx, oai.CompletionNewParams{
		Model:     "tiny",
		Prompt:    oai.CompletionNewParamsPromptUnion{OfString: oai.String("Once upon a time")},
		MaxTokens: oai.Int(6),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.CompletionTokens != 6 || resp.Choices[0].FinishReason != "length" {
		t.Fatalf("completion %s", resp.RawJSON())
	}
	stream := client.Completions.NewStreaming(ctx, oai.CompletionNewParams{
		Model:  "tiny",
		Prompt: oai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3}}, MaxTokens: oai.Int(4),
	}, option.WithJSONSet("ignore_eos", true))
	var finish string
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 && c.Choices[0].FinishReason != "" {
			finish = string(c.Choices[0].FinishReason)
		}
	}
	if err := stream.Err(); err != nil || finish != "length" {
		t.Fatalf("completion stream: finish %q, err %v", finish, err)
	}
	_ = stream.Close()

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "tiny" {
		t.Fatalf("models %s", models.RawJSON())
	}
	m, err := client.Models.Get(ctx, "tiny")
	if err != nil || m.ID != "tiny" {
		t.Fatalf("model tiny: %v %v", m, err)
	}
}

// TestGoSDKErrors: the SDK sees our errors as *openai.Error with the
// status, type, param and code the handler sets.
func TestGoSDKErrors(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	cases := []struct {
		name   string
		mutate func(*oai.ChatCompletionNewParams)
		opts   []option.RequestOption
		status int
		param  string
		code   string
	}{
		{"unknown model", func(p *oai.ChatCompletionNewParams) { p.Model = "gpt-4o" }, nil, http.StatusNotFound, "model", "model_not_found"},
		{"temperature", func(p *oai.ChatCompletionNewParams) { p.Temperature = oai.Float(5) }, nil, http.StatusBadRequest, "temperature", "invalid_value"},
		{"n", func(p *oai.ChatCompletionNewParams) { p.N = oai.Int(9) }, nil, http.StatusBadRequest, "n", "invalid_value"},
		{"context", func(p *oai.ChatCompletionNewParams) { p.MaxTokens = oai.Int(100000) }, nil, http.StatusBadRequest, "messages", "context_length_exceeded"},
		{"tier", func(*oai.ChatCompletionNewParams) {}, []option.RequestOption{option.WithHeader("X-Priority", "urgent")}, http.StatusBadRequest, "priority", "invalid_value"},
		{"tool parameters", func(p *oai.ChatCompletionNewParams) {
			bad := oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "bad",
				Parameters: map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"not": map[string]any{"type": "string"}}}}})
			p.Tools = []oai.ChatCompletionToolUnionParam{weatherTool(), bad}
			p.ToolChoice = oai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oai.String("required")}
		}, nil, http.StatusBadRequest, "tools[1].function.parameters", "invalid_value"},
	}
	for _, c := range cases {
		p := chatParams()
		c.mutate(&p)
		_, err := client.Chat.Completions.New(ctx, p, c.opts...)
		var apiErr *oai.Error
		if !errors.As(err, &apiErr) {
			t.Errorf("%s: error %v is not *openai.Error", c.name, err)
			continue
		}
		if apiErr.StatusCode != c.status || apiErr.Param != c.param || apiErr.Code != c.code || apiErr.Message == "" {
			t.Errorf("%s: %d param %q code %q message %q", c.name, apiErr.StatusCode, apiErr.Param, apiErr.Code, apiErr.Message)
		}
	}
	// A streaming request that fails before its first token gets a real status.
	p := chatParams()
	p.Model = "missing"
	stream := client.Chat.Completions.NewStreaming(ctx, p)
	for stream.Next() {
	}
	var apiErr *oai.Error
	if err := stream.Err(); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, "missing") {
		t.Fatalf("stream error %v", err)
	}
	_ = stream.Close()
}

// TestGoSDKCachedTokens: through openai-go, a conversation's second turn
// (sent with the X-Session-ID the first response returned) and a second
// user with the same system prompt and no session report cached tokens.
func TestGoSDKCachedTokens(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	system := oai.SystemMessage(strings.Repeat("You answer briefly and never use lists. ", 6))
	params := func(msgs ...oai.ChatCompletionMessageParamUnion) oai.ChatCompletionNewParams {
		return oai.ChatCompletionNewParams{Model: "tiny", Messages: append([]oai.ChatCompletionMessageParamUnion{system}, msgs...),
			MaxTokens: oai.Int(8), Temperature: oai.Float(0)}
	}
	var hdr *http.Response
	first, err := client.Chat.Completions.New(ctx, params(oai.UserMessage("Name a color.")), option.WithResponseInto(&hdr))
	if err != nil {
		t.Fatal(err)
	}
	id := hdr.Header.Get("X-Session-ID")
	if id == "" {
		t.Fatal("no X-Session-ID on the response")
	}
	second, err := client.Chat.Completions.New(ctx, params(oai.UserMessage("Name a color."),
		oai.AssistantMessage(first.Choices[0].Message.Content), oai.UserMessage("Another one?")), option.WithHeader("X-Session-ID", id))
	if err != nil {
		t.Fatal(err)
	}
	if c := second.Usage.PromptTokensDetails.CachedTokens; c == 0 {
		t.Fatalf("second turn: cached_tokens 0 of %d", second.Usage.PromptTokens)
	}
	other, err := client.Chat.Completions.New(ctx, params(oai.UserMessage("What is two plus two?")))
	if err != nil {
		t.Fatal(err)
	}
	if c := other.Usage.PromptTokensDetails.CachedTokens; c == 0 {
		t.Fatalf("a second user with the same system prompt: cached_tokens 0 of %d", other.Usage.PromptTokens)
	}
	t.Logf("cached tokens: second turn %d of %d, second user %d of %d", second.Usage.PromptTokensDetails.CachedTokens,
		second.Usage.PromptTokens, other.Usage.PromptTokensDetails.CachedTokens, other.Usage.PromptTokens)
}

// TestGoSDKStreamCutByDeadline: a stream cut by the server's total
// deadline after tokens ends, for openai-go, with a *ssestream.StreamError
// whose event names the deadline; the text before it arrived.
func TestGoSDKStreamCutByDeadline(t *testing.T) {
	base := startServerWith(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)},
		[]mlxserving.Option{mlxserving.WithDeadlines(retry.Deadlines{Total: 150 * time.Millisecond})})
	client := newClient(base)
	p := chatParams()
	p.MaxTokens = oai.Int(400)
	stream := client.Chat.Completions.NewStreaming(context.Background(), p)
	chunks := 0
	for stream.Next() {
		chunks++
	}
	var se *ssestream.StreamError
	if err := stream.Err(); !errors.As(err, &se) || !strings.Contains(string(se.Event.Data), `"code":"request_timeout"`) || chunks == 0 {
		t.Fatalf("after %d chunks: %v, want a StreamError naming the deadline", chunks, err)
	}
	_ = stream.Close()
}
