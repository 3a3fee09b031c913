package tokenizer

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// filterPyToJSON is transformers' tojson: json.dumps with ensure_ascii
// False by default, Python's separators (", ", ": ") or indent, key order
// kept for template dict literals and sorted for Go maps.
func filterPyToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	enc := pyJSON{itemSep: ", ", keySep: ": "}
	if v, ok := params.KwArgs["ensure_ascii"]; ok {
		enc.ensureASCII = v.IsTrue()
	}
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		if !v.IsInteger() {
			return exec.AsValue(fmt.Errorf("tojson: indent must be an integer"))
		}
		enc.indent = strings.Repeat(" ", v.Integer())
		enc.itemSep = ","
	}
	if v, ok := params.KwArgs["separators"]; ok && v.IsList() && v.Len() == 2 {
		enc.itemSep, enc.keySep = v.Index(0).String(), v.Index(1).String()
	}
	if len(params.Args) > 0 && params.Args[0].IsInteger() {
		enc.indent = strings.Repeat(" ", params.Args[0].Integer())
		enc.itemSep = ","
	}
	var sb strings.Builder
	if err := enc.value(&sb, in, 0); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(sb.String())
}

type pyJSON struct {
	ensureASCII     bool
	indent          string // "" : one line
	itemSep, keySep string
}

func (p *pyJSON) newline(sb *strings.Builder, depth int) {
	if p.indent == "" {
		return
	}
	sb.WriteByte('\n')
	for range depth {
		sb.WriteString(p.indent)
	}
}

func (p *pyJSON) value(sb *strings.Builder, v *exec.Value, depth int) error {
	if depth > 100 {
		return fmt.Errorf("tojson: nesting deeper than 100")
	}
	if v == nil || v.IsNil() {
		sb.WriteString("null")
		return nil
	}
	rv := reflect.ValueOf(v.Interface())
	for rv.Kind() == reflect.Interface || rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			sb.WriteString("null")
			return nil
		}
		rv = rv.Elem()
	}
	if d, ok := rv.Interface().(exec.Dict); ok {
		return p.pairs(sb, d.Pairs, depth)
	}
	switch rv.Kind() {
	case reflect.Bool:
		sb.WriteString(map[bool]string{true: "true", false: "false"}[rv.Bool()])
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		sb.WriteString(strconv.FormatInt(rv.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		sb.WriteString(strconv.FormatUint(rv.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		sb.WriteString(pyFloat(rv.Float()))
	case reflect.String:
		p.str(sb, rv.String())
	case reflect.Slice, reflect.Array:
		return p.list(sb, rv, depth)
	case reflect.Map:
		return p.goMap(sb, rv, depth)
	default:
		return fmt.Errorf("tojson: cannot encode %s", rv.Type())
	}
	return nil
}

func (p *pyJSON) list(sb *strings.Builder, rv reflect.Value, depth int) error {
	if rv.Len() == 0 {
		sb.WriteString("[]")
		return nil
	}
	sb.WriteByte('[')
	for i := 0; i < rv.Len(); i++ {
		if i > 0 {
			sb.WriteString(p.itemSep)
		}
		p.newline(sb, depth+1)
		if err := p.value(sb, exec.ToValue(rv.Index(i)), depth+1); err != nil {
			return err
		}
	}
	p.newline(sb, depth)
	sb.WriteByte(']')
	return nil
}

func (p *pyJSON) goMap(sb *strings.Builder, rv reflect.Value, depth int) error {
	keys := rv.MapKeys()
	names := make([]string, len(keys))
	byName := make(map[string]reflect.Value, len(keys))
	for i, k := range keys {
		names[i] = fmt.Sprint(k.Interface())
		byName[names[i]] = rv.MapIndex(k)
	}
	sort.Strings(names)
	pairs := make([]*exec.Pair, len(names))
	for i, n := range names {
		pairs[i] = &exec.Pair{Key: exec.AsValue(n), Value: exec.ToValue(byName[n])}
	}
	return p.pairs(sb, pairs, depth)
}

func (p *pyJSON) pairs(sb *strings.Builder, pairs []*exec.Pair, depth int) error {
	if len(pairs) == 0 {
		sb.WriteString("{}")
		return nil
	}
	sb.WriteByte('{')
	for i, kv := range pairs {
		if i > 0 {
			sb.WriteString(p.itemSep)
		}
		p.newline(sb, depth+1)
		p.str(sb, kv.Key.String())
		sb.WriteString(p.keySep)
		if err := p.value(sb, kv.Value, depth+1); err != nil {
			return err
		}
	}
	p.newline(sb, depth)
	sb.WriteByte('}')
	return nil
}

// str writes s as json.dumps does.
func (p *pyJSON) str(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (p.ensureASCII && r == 0x7f):
				fmt.Fprintf(sb, `\u%04x`, r)
			case p.ensureASCII && r > 0x7f:
				if r > 0xFFFF {
					r -= 0x10000
					fmt.Fprintf(sb, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
				} else {
					fmt.Fprintf(sb, `\u%04x`, r)
				}
			default:
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

// pyFloat formats f as Python's repr does.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-4 || abs >= 1e16) {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		mant, exp, _ := strings.Cut(s, "e")
		if len(exp) == 3 && (exp[0] == '+' || exp[0] == '-') && exp[1] == '0' {
			exp = exp[:1] + exp[2:]
		}
		return mant + "e" + exp
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// strftime formats t with a C strftime format (the directives chat
// templates use; "%-d" style flags drop padding as glibc does).
func strftime(t time.Time, format string) string {
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			sb.WriteByte(c)
			continue
		}
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) {
			noPad = true
			i++
		}
		sb.WriteString(strftimeDirective(t, format[i], noPad))
	}
	return sb.String()
}

func strftimeDirective(t time.Time, d byte, noPad bool) string {
	num := func(v, width int) string {
		if noPad {
			return strconv.Itoa(v)
		}
		return fmt.Sprintf("%0*d", width, v)
	}
	hour12 := t.Hour() % 12
	if hour12 == 0 {
		hour12 = 12
	}
	switch d {
	case 'Y':
		return strconv.Itoa(t.Year())
	case 'y':
		return num(t.Year()%100, 2)
	case 'm':
		return num(int(t.Month()), 2)
	case 'd':
		return num(t.Day(), 2)
	case 'e':
		return fmt.Sprintf("%2d", t.Day())
	case 'H':
		return num(t.Hour(), 2)
	case 'I':
		return num(hour12, 2)
	case 'M':
		return num(t.Minute(), 2)
	case 'S':
		return num(t.Second(), 2)
	case 'j':
		return num(t.YearDay(), 3)
	case 'B':
		return t.Month().String()
	case 'b', 'h':
		return t.Month().String()[:3]
	case 'A':
		return t.Weekday().String()
	case 'a':
		return t.Weekday().String()[:3]
	case 'p':
		return map[bool]string{true: "PM", false: "AM"}[t.Hour() >= 12]
	case 'Z':
		name, _ := t.Zone()
		return name
	case 'z':
		return t.Format("-0700")
	case '%':
		return "%"
	}
	return "%" + string(d)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
