package compat_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

const personSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "email": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]}
  },
  "required": ["name", "age", "tags", "email"],
  "additionalProperties": false
}`

const weatherParams = `{"type":"object","properties":{"city":{"type":"string","maxLength":12},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}`

func compileSchema(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validate(t *testing.T, s *jsonschema.Schema, text string) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("output is not JSON: %q: %v", text, err)
	}
	if err := s.Validate(v); err != nil {
		t.Fatalf("output %q does not validate: %v", text, err)
	}
}

// TestGoSDKStructuredOutput: response_format json_schema and json_object
// through openai-go, streaming and not, on the simulated engine (random
// tokens where the grammar leaves a choice): the reply is complete JSON
// that validates, with finish_reason stop.
func TestGoSDKStructuredOutput(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	val := compileSchema(t, personSchema)
	var schema map[string]any
	if err := json.Unmarshal([]byte(personSchema), &schema); err != nil {
		t.Fatal(err)
	}
	for seed := int64(1); seed <= 4; seed++ {
		p := chatParams()
		p.MaxTokens = oai.Int(400)
		p.Temperature = oai.Float(1)
		p.Seed = oai.Int(seed)
		p.ResponseFormat = oai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Schema: schema, Strict: oai.Bool(true)},
		}}
		resp, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			var ae *oai.Error
			if errors.As(err, &ae) {
				t.Fatalf("%v: %s", err, ae.RawJSON())
			}
			t.Fatal(err)
		}
		if resp.Choices[0].FinishReason != "stop" {
			t.Fatalf("finish %q: %q", resp.Choices[0].FinishReason, resp.Choices[0].Message.Content)
		}
		validate(t, val, resp.Choices[0].Message.Content)

		stream := client.Chat.Completions.NewStreaming(ctx, p)
		var acc oai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		_ = stream.Close()
		if acc.Choices[0].Message.Content != resp.Choices[0].Message.Content {
			t.Fatalf("streamed %q, non-streamed %q", acc.Choices[0].Message.Content, resp.Choices[0].Message.Content)
		}
	}
	p := chatParams()
	p.MaxTokens = oai.Int(470)
	p.ResponseFormat = oai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	resp, err := client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// Any JSON object may be long; complete ones parse, cut ones are a
	// valid prefix (the grammar's own tests check prefixes).
	var obj map[string]any
	content := resp.Choices[0].Message.Content
	switch resp.Choices[0].FinishReason {
	case "stop":
		if json.Unmarshal([]byte(content), &obj) != nil {
			t.Fatalf("json_object: %q", content)
		}
	case "length":
		if !strings.HasPrefix(strings.TrimSpace(content), "{") {
			t.Fatalf("json_object cut short: %q", content)
		}
	default:
		t.Fatalf("json_object: finish %q", resp.Choices[0].FinishReason)
	}
}

func weatherTool() oai.ChatCompletionToolUnionParam {
	var params map[string]any
	_ = json.Unmarshal([]byte(weatherParams), &params)
	return oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name: "get_weather", Description: oai.String("Weather in a city"), Parameters: params,
	})
}

// TestGoSDKToolCalls: tool_choice required and a named function force a
// valid call, reported as tool_calls with finish_reason tool_calls, whole
// and streamed; the call and the tool's answer go back in the next turn.
func TestGoSDKToolCalls(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	val := compileSchema(t, weatherParams)
	noop := oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "noop"})
	choices := []oai.ChatCompletionToolChoiceOptionUnionParam{
		{OfAuto: oai.String("required")},
		oai.ToolChoiceOptionFunctionToolChoice(oai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}),
	}
	for i, choice := range choices {
		p := chatParams()
		p.MaxTokens = oai.Int(300)
		p.Temperature = oai.Float(1)
		p.Seed = oai.Int(int64(10 + i))
		p.Tools = []oai.ChatCompletionToolUnionParam{weatherTool(), noop}
		p.ToolChoice = choice
		resp, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		c := resp.Choices[0]
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 {
			t.Fatalf("choice %d: %s", i, resp.RawJSON())
		}
		call := c.Message.ToolCalls[0]
		if call.ID == "" || call.Type != "function" {
			t.Fatalf("call %s", call.RawJSON())
		}
		switch call.Function.Name {
		case "get_weather":
			validate(t, val, call.Function.Arguments)
		case "noop":
			if i == 1 || !json.Valid([]byte(call.Function.Arguments)) {
				t.Fatalf("choice %d called %s(%s)", i, call.Function.Name, call.Function.Arguments)
			}
		default:
			t.Fatalf("unknown function %q", call.Function.Name)
		}

		stream := client.Chat.Completions.NewStreaming(ctx, p)
		var acc oai.ChatCompletionAccumulator
		sawIndex, argDeltas := false, 0
		for stream.Next() {
			ch := stream.Current()
			acc.AddChunk(ch)
			for _, d := range ch.Choices {
				for _, tc := range d.Delta.ToolCalls {
					sawIndex = sawIndex || tc.JSON.Index.Valid()
					if tc.Function.Arguments != "" {
						argDeltas++
					}
				}
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		_ = stream.Close()
		sc := acc.Choices[0]
		if sc.FinishReason != "tool_calls" || len(sc.Message.ToolCalls) != 1 || !sawIndex {
			t.Fatalf("streamed choice %d: finish %q, calls %+v", i, sc.FinishReason, sc.Message.ToolCalls)
		}
		if call.Function.Name == "get_weather" && argDeltas < 3 {
			t.Errorf("arguments came in %d deltas: not streamed", argDeltas)
		}
		if sc.Message.ToolCalls[0].Function.Name != call.Function.Name || sc.Message.ToolCalls[0].Function.Arguments != call.Function.Arguments {
			t.Fatalf("streamed call %+v, whole call %+v", sc.Message.ToolCalls[0].Function, call.Function)
		}

		// The call and its result go back in the next turn.
		next := chatParams()
		next.Messages = append(next.Messages, c.Message.ToParam(), oai.ToolMessage(`{"temp": 21}`, call.ID))
		next.Tools = p.Tools
		if _, err := client.Chat.Completions.New(ctx, next); err != nil {
			t.Fatalf("tool result turn: %v", err)
		}
	}
}

// TestGoSDKSamplingFields: logit_bias, presence/frequency penalties and
// top_logprobs as OpenAI defines them.
func TestGoSDKSamplingFields(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	p := chatParams()
	p.MaxTokens = oai.Int(5)
	p.LogitBias = map[string]int64{"72": 100} // byte 'H' in the test tokenizer's byte range
	p.Logprobs = oai.Bool(true)
	p.TopLogprobs = oai.Int(3)
	p.PresencePenalty = oai.Float(0.5)
	p.FrequencyPenalty = oai.Float(0.5)
	resp, err := client.Chat.Completions.New(ctx, p, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	lp := resp.Choices[0].Logprobs.Content
	if len(lp) != 5 {
		t.Fatalf("%d logprob entries for 5 tokens: %s", len(lp), resp.RawJSON())
	}
	for _, e := range lp {
		if len(e.TopLogprobs) != 3 {
			t.Fatalf("top_logprobs: %d entries, want 3", len(e.TopLogprobs))
		}
	}
	first := lp[0].Bytes
	for _, e := range lp {
		if len(e.Bytes) != len(first) || string(rune(e.Bytes[0])) != string(rune(first[0])) {
			t.Fatalf("logit_bias +100 on one token: tokens %q then %q", rune(first[0]), e.Token)
		}
	}
}

// TestGoSDKChoices: n choices, whole and streamed, each with its index;
// seeded choices differ from each other and repeat across requests.
func TestGoSDKChoices(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	p := chatParams()
	p.N = oai.Int(3)
	p.Temperature = oai.Float(1)
	p.MaxTokens = oai.Int(8)
	ignoreEOS := option.WithJSONSet("ignore_eos", true)
	resp, err := client.Chat.Completions.New(ctx, p, ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 3 || resp.Usage.CompletionTokens != 24 {
		t.Fatalf("3 choices of 8 tokens: %s", resp.RawJSON())
	}
	seen := map[string]bool{}
	for i, c := range resp.Choices {
		if c.Index != int64(i) || c.FinishReason != "length" {
			t.Fatalf("choice %d: %s", i, c.RawJSON())
		}
		seen[c.Message.Content] = true
	}
	if len(seen) < 2 {
		t.Fatalf("seeded choices are all the same: %v", seen)
	}
	p.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, p, ignoreEOS)
	var acc oai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if len(acc.Choices) != 3 || acc.Usage.CompletionTokens != 24 {
		t.Fatalf("streamed: %d choices, usage %+v", len(acc.Choices), acc.Usage)
	}
	for i, c := range acc.Choices {
		if c.Message.Content != resp.Choices[i].Message.Content {
			t.Fatalf("choice %d streamed %q, whole %q", i, c.Message.Content, resp.Choices[i].Message.Content)
		}
	}
}

// TestGoSDKToolCallCutShort: a forced call cut by max_tokens (with
// close_within_max_tokens false) comes back with finish_reason length and
// the call as far as it got, whole as streamed, never as an empty reply.
func TestGoSDKToolCallCutShort(t *testing.T) {
	client := newClient(startServer(t))
	cut := option.WithJSONSet("close_within_max_tokens", false)
	ctx := context.Background()
	p := chatParams()
	p.MaxTokens = oai.Int(30) // the call takes about 60 (jump-forward appends its keys)
	p.Seed = oai.Int(3)
	p.Tools = []oai.ChatCompletionToolUnionParam{weatherTool()}
	p.ToolChoice = oai.ToolChoiceOptionFunctionToolChoice(oai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"})
	resp, err := client.Chat.Completions.New(ctx, p, cut)
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Choices[0]
	if c.FinishReason != "length" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "get_weather" ||
		c.Message.ToolCalls[0].ID == "" {
		t.Fatalf("non-streamed call cut short: %s", resp.RawJSON())
	}
	whole := c.Message.ToolCalls[0].Function.Arguments
	stream := client.Chat.Completions.NewStreaming(ctx, p, cut)
	var acc oai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	sc := acc.Choices[0]
	if sc.FinishReason != "length" || len(sc.Message.ToolCalls) != 1 || sc.Message.ToolCalls[0].Function.Arguments != whole {
		t.Fatalf("streamed: finish %q, calls %+v; non-streamed arguments %q", sc.FinishReason, sc.Message.ToolCalls, whole)
	}
}

// TestGoSDKToolCallClosed: a forced call whose budget ends before the
// model would finish it comes back closed: finish_reason length, and
// arguments that parse and validate, for max_tokens from the call's
// minimum up; below it, a 400 on max_tokens.
func TestGoSDKToolCallClosed(t *testing.T) {
	client := newClient(startServer(t))
	ctx := context.Background()
	val := compileSchema(t, weatherParams)
	p := chatParams()
	p.Tools = []oai.ChatCompletionToolUnionParam{weatherTool()}
	p.ToolChoice = oai.ToolChoiceOptionFunctionToolChoice(oai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"})
	p.MaxTokens = oai.Int(3)
	var apiErr *oai.Error
	if _, err := client.Chat.Completions.New(ctx, p); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "max_tokens" {
		t.Fatalf("max_tokens 3: %v, want a 400 on max_tokens", err)
	}
	calls := 0
	for max := int64(24); max <= 64; max += 8 {
		p.MaxTokens = oai.Int(max)
		p.Seed = oai.Int(max)
		resp, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			if errors.As(err, &apiErr) && apiErr.Param == "max_tokens" {
				continue // below the call's minimum
			}
			t.Fatalf("max_tokens %d: %v", max, err)
		}
		c := resp.Choices[0]
		if len(c.Message.ToolCalls) != 1 {
			t.Fatalf("max_tokens %d: %s", max, resp.RawJSON())
		}
		validate(t, val, c.Message.ToolCalls[0].Function.Arguments)
		calls++
		t.Logf("max_tokens %d: %s %s", max, c.FinishReason, c.Message.ToolCalls[0].Function.Arguments)
	}
	if calls == 0 {
		t.Fatal("every max_tokens was below the call's minimum")
	}
}
