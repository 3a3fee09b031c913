package openai

import (
	"encoding/json"
	"strings"

	"github.com/mlxserving/mlxserving/toolcall"
)

// toolStream holds back streamed text that may be a tool call, releasing
// the rest as content. Calls stream as they are generated: an opening
// delta (index, id, name) once the name is complete, then the arguments
// as they come. A forced call is the whole text; in auto mode the held
// text is scanned (JSON depth, strings aware) for call objects.
type toolStream struct {
	f      toolcall.Format
	forced bool
	held   strings.Builder
	locked bool // everything from here on is held
	text   strings.Builder

	// the call being streamed
	index  int    // its index among the reply's calls
	opened bool   // its opening delta went out
	argsAt int    // where its arguments start, from callAt
	sent   int    // bytes of its arguments sent
	id     string // its id
	// the auto-mode scanner over held
	scan, depth int
	inStr, esc  bool
	callAt      int // where the current call object starts; -1: none
	streamed    bool
}

// toolDelta is one streamed piece of call index: its opening (id and
// name) or more of its arguments.
type toolDelta struct {
	index          int
	id, name, args string
}

const hermesOpen = "<tool_call>"

func newToolStream(f toolcall.Format, forced bool) *toolStream {
	return &toolStream{f: f, forced: forced, callAt: -1}
}

// feed takes a text delta and returns the text safe to send as content
// and the call deltas ready to send.
func (t *toolStream) feed(delta string) (string, []toolDelta) {
	if t.forced {
		t.held.WriteString(delta)
		return "", t.partial(t.held.String())
	}
	if t.locked {
		t.held.WriteString(delta)
		return "", t.scanCalls()
	}
	all := t.held.String() + delta
	t.held.Reset()
	if t.f == toolcall.Hermes {
		if i := strings.Index(all, hermesOpen); i >= 0 {
			t.held.WriteString(all[i:])
			t.locked = true
			return t.emit(all[:i]), t.scanCalls()
		}
		// Hold the longest suffix that may begin the opener.
		for j := max(0, len(all)-len(hermesOpen)); j < len(all); j++ {
			if strings.HasPrefix(hermesOpen, all[j:]) {
				t.held.WriteString(all[j:])
				return t.emit(all[:j]), nil
			}
		}
		return t.emit(all), nil
	}
	if t.text.Len() == 0 && t.f.MayStart(all) {
		t.held.WriteString(all)
		if strings.TrimSpace(all) != "" && !strings.HasPrefix(strings.TrimSpace(all), "<") {
			t.locked = true
			return "", t.scanCalls()
		}
		return "", nil
	}
	return t.emit(all), nil
}

func (t *toolStream) emit(s string) string {
	t.text.WriteString(s)
	return s
}

// scanCalls advances the scanner over the held text, streaming the call
// objects it finds at the top level (inside the list for Mistral).
func (t *toolStream) scanCalls() []toolDelta {
	all := t.held.String()
	base := 0
	if t.f == toolcall.Mistral {
		base = 1
	}
	var out []toolDelta
	for ; t.scan < len(all); t.scan++ {
		c := all[t.scan]
		if t.inStr {
			switch {
			case t.esc:
				t.esc = false
			case c == '\\':
				t.esc = true
			case c == '"':
				t.inStr = false
			}
			continue
		}
		switch c {
		case '"':
			t.inStr = true
		case '{', '[':
			if c == '{' && t.depth == base && t.callAt < 0 {
				t.callAt = t.scan
			}
			t.depth++
		case '}', ']':
			t.depth--
			if c == '}' && t.depth == base && t.callAt >= 0 {
				out = append(out, t.complete(all[t.callAt:t.scan+1])...)
				t.callAt = -1
			}
		}
	}
	if t.callAt >= 0 {
		out = append(out, t.partial(all[t.callAt:])...)
	}
	return out
}

// partial streams the call whose text so far is seg: everything before
// the last "}" of its arguments is arguments (what closes the call and
// the whitespace before it come only after).
func (t *toolStream) partial(seg string) []toolDelta {
	var out []toolDelta
	if !t.opened {
		name, at, ok := toolcall.ForcedHead(seg)
		if !ok {
			return nil
		}
		t.opened, t.argsAt, t.id, t.sent, t.streamed = true, at, callID(), 0, true
		out = append(out, toolDelta{index: t.index, id: t.id, name: name})
	}
	args := seg[t.argsAt:]
	if t.sent == 0 { // whitespace before the arguments is not theirs
		trimmed := strings.TrimLeft(args, " \t\r\n")
		t.argsAt += len(args) - len(trimmed)
		args = trimmed
	}
	safe := strings.LastIndexByte(args, '}')
	if safe < 0 {
		safe = len(args)
	}
	safe = len(strings.TrimRight(args[:safe], " \t\r\n"))
	if safe > t.sent {
		out = append(out, toolDelta{index: t.index, args: args[t.sent:safe]})
		t.sent = safe
	}
	return out
}

// complete ends the call object seg: the rest of its arguments (or the
// whole call, if its name never showed before) and on to the next index.
func (t *toolStream) complete(seg string) []toolDelta {
	call, ok := toolcall.ParseCall(seg)
	if !ok {
		return nil // not a call: the text stays content at the end
	}
	var out []toolDelta
	if !t.opened {
		t.id, t.sent, t.streamed = callID(), 0, true
		out = append(out, toolDelta{index: t.index, id: t.id, name: call.Name})
	}
	if len(call.Arguments) > t.sent {
		out = append(out, toolDelta{index: t.index, args: call.Arguments[t.sent:]})
	}
	t.index++
	t.opened, t.sent = false, 0
	return out
}

// finish parses what was held: held text that turned out to be content,
// the calls found, and the rest of a streamed call's arguments. When
// calls were streamed, they are not to be sent again.
func (t *toolStream) finish() (string, []toolcall.Call, []toolDelta) {
	held := t.held.String()
	t.held.Reset()
	if held == "" {
		return "", nil, nil
	}
	content, calls := t.f.Parse(held, t.forced)
	if t.forced || t.streamed {
		if len(calls) <= t.index && !t.opened {
			if t.streamed && len(calls) > 0 {
				return "", calls, nil
			}
			return "", nil, nil // cut short by max_tokens
		}
		var tail []toolDelta
		if t.opened && t.index < len(calls) {
			if a := calls[t.index].Arguments; len(a) > t.sent {
				tail = append(tail, toolDelta{index: t.index, args: a[t.sent:]})
			}
		}
		if len(calls) == 0 {
			return "", nil, tail
		}
		return "", calls, tail
	}
	if len(calls) == 0 {
		return held, nil, nil
	}
	return content, calls, nil
}

// whole reads a finished reply's text as a stream delivers it: its
// content and calls. complete is true when the calls parsed whole (finish
// "tool_calls"); otherwise calls are what streamed of calls that
// generation cut short (max_tokens), complete ones before the cut
// included, so a reply never loses them when not streamed.
func (t *toolStream) whole(text string) (content string, calls []toolCall, complete bool) {
	content, deltas := t.feed(text)
	rest, parsed, tail := t.finish()
	content += rest
	if len(parsed) > 0 {
		return content, toolCalls(parsed), true
	}
	for _, d := range append(deltas, tail...) {
		if d.id != "" {
			var c toolCall
			c.ID, c.Type, c.Function.Name = d.id, "function", d.name
			calls = append(calls, c)
			continue
		}
		calls[d.index].Function.Arguments += d.args
	}
	return content, calls, false
}

// deltaChunk sends one toolDelta.
func (f *format) deltaChunk(d toolDelta) ([]byte, error) {
	idx := d.index
	tc := toolCall{Index: &idx, ID: d.id}
	if d.id != "" {
		tc.Type = "function"
	}
	tc.Function.Name, tc.Function.Arguments = d.name, d.args
	delta, err := json.Marshal(map[string]any{"tool_calls": []toolCall{tc}})
	if err != nil {
		return nil, err
	}
	c := append(f.openChoice(append([]byte(nil), f.prefix...)), `,"delta":`...)
	c = append(c, delta...)
	c = append(c, `,"logprobs":null,"finish_reason":null}]`...)
	return f.end(c), nil
}
