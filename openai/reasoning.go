package openai

// A reasoning model's <think> block goes to reasoning_content, as vLLM
// and SGLang return it: message.reasoning_content in a whole reply,
// delta.reasoning_content in a stream. Tool calls are parsed from the
// content only.

// appendDelta appends a chat chunk's delta object: reasoning_content when
// there is reasoning, content when there is content or nothing else.
func appendDelta(b []byte, reasoning, content string) []byte {
	b = append(b, '{')
	if reasoning != "" {
		b = appendString(append(b, `"reasoning_content":`...), reasoning)
		if content == "" {
			return append(b, '}')
		}
		b = append(b, ',')
	}
	b = appendString(append(b, `"content":`...), content)
	return append(b, '}')
}

// splitReasoning splits a whole reply's text into its reasoning and its
// content (all content when the format splits no reasoning).
func (f *format) splitReasoning(text string) (reasoning, content string) {
	if f.reasoning == nil {
		return "", text
	}
	reasoning, content = f.reasoning.Feed(text)
	r, c := f.reasoning.Flush()
	return reasoning + r, content + c
}

// withReasoning adds reasoning_content to a whole reply's message when
// there is reasoning.
func withReasoning(body map[string]any, reasoning string) {
	if reasoning == "" {
		return
	}
	msg := body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	msg["reasoning_content"] = reasoning
}
