package tokenizer

import (
	"errors"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"reflect"
	"sort"
	"strings"
	"unicode"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// pyList is a list as chat templates see it. It exists for Python's
// indexing: gonja's own lookup refuses items[-n] when n equals the length
// (messages[-1] of a one-message conversation).
type pyList []any

// GetItem implements gonja's ItemGetter with Python's negative indexes.
func (l pyList) GetItem(key any) (*exec.Value, bool) {
	i, ok := key.(int)
	if !ok {
		return exec.AsValue(nil), false
	}
	if i < 0 {
		i += len(l)
	}
	if i < 0 || i >= len(l) {
		return exec.AsValue(nil), false
	}
	return exec.ToValue(l[i]), true
}

// pyData copies caller data into template values: lists become pyList,
// recursively.
func pyData(v any) any {
	switch x := v.(type) {
	case []any:
		out := make(pyList, len(x))
		for i, e := range x {
			out[i] = pyData(e)
		}
		return out
	case []map[string]any:
		out := make(pyList, len(x))
		for i, e := range x {
			out[i] = pyData(e)
		}
		return out
	case []string:
		out := make(pyList, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = pyData(e)
		}
		return out
	}
	return v
}

// filterItems is Jinja's items filter: (key, value) pairs, in order for
// template dict literals and by sorted key for Go maps.
func filterItems(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if in.IsNil() {
		return exec.AsValue(pyList{})
	}
	if d, ok := in.Interface().(exec.Dict); ok {
		out := make(pyList, len(d.Pairs))
		for i, p := range d.Pairs {
			out[i] = pyList{p.Key.Interface(), p.Value.Interface()}
		}
		return exec.AsValue(out)
	}
	rv := reflect.ValueOf(in.Interface())
	if rv.Kind() != reflect.Map {
		return exec.AsValue(errors.New("items requires a mapping"))
	}
	keys := rv.MapKeys()
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	out := make(pyList, len(keys))
	for i, k := range keys {
		out[i] = pyList{k.Interface(), rv.MapIndex(k).Interface()}
	}
	return exec.AsValue(out)
}

// strMethodNames are gonja's built-in string methods, copied into each
// template environment.
var strMethodNames = []string{"capitalize", "capwords", "casefold", "center", "count", "encode", "endswith",
	"expandtabs", "find", "format", "format_map", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
	"islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip",
	"partition", "removeprefix", "removesuffix", "replace", "rfind", "rjust", "rpartition", "rsplit", "rstrip",
	"split", "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill"}

// templateMethods copies gonja's methods, making the string methods that
// return lists (split, rsplit, splitlines) return pyList so that
// s.split(x)[-1] works when there is only one part.
func templateMethods() exec.Methods {
	base := builtins.Methods
	str := map[string]exec.Method[string]{}
	for _, name := range strMethodNames {
		fn, ok := base.Str.Get(name)
		if !ok {
			continue
		}
		switch name {
		case "split":
			str[name] = pySplit
		case "rsplit":
			str[name] = pyRSplit
		case "strip", "lstrip", "rstrip":
			str[name] = pyStrip(name)
		case "replace":
			str[name] = pyReplace
		case "splitlines":
			str[name] = func(self string, selfValue *exec.Value, args *exec.VarArgs) (any, error) {
				out, err := fn(self, selfValue, args)
				if err != nil {
					return nil, err
				}
				return toPyList(out), nil
			}
		default:
			str[name] = fn
		}
	}
	m := base
	m.Str = exec.NewMethodSet(str)
	return m
}

// toPyList converts a list a method returned into a pyList.
func toPyList(v any) any {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice {
		return v
	}
	out := make(pyList, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out
}

// pySplit is Python's str.split(sep=None, maxsplit=-1), returning a pyList.
func pySplit(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
	sep, maxsplit := "", -1
	hasSep := false
	if len(args.Args) > 0 && !args.Args[0].IsNil() {
		sep, hasSep = args.Args[0].String(), true
	}
	if v, ok := args.KwArgs["sep"]; ok && !v.IsNil() {
		sep, hasSep = v.String(), true
	}
	if len(args.Args) > 1 {
		maxsplit = args.Args[1].Integer()
	}
	if v, ok := args.KwArgs["maxsplit"]; ok {
		maxsplit = v.Integer()
	}
	var parts []string
	switch {
	case hasSep && sep == "":
		return nil, errors.New("split: empty separator")
	case hasSep:
		parts = strings.SplitN(self, sep, maxsplit+1)
		if maxsplit < 0 {
			parts = strings.Split(self, sep)
		}
	default:
		parts = fieldsN(self, maxsplit)
	}
	return toPyList(parts), nil
}

// fieldsN splits on runs of whitespace like Python's split() with no
// separator, at most maxsplit times (negative: no limit).
func fieldsN(s string, maxsplit int) []string {
	var out []string
	for {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
		if s == "" {
			return out
		}
		if maxsplit >= 0 && len(out) == maxsplit {
			return append(out, s)
		}
		end := strings.IndexFunc(s, unicode.IsSpace)
		if end < 0 {
			return append(out, s)
		}
		out = append(out, s[:end])
		s = s[end:]
	}
}

// pyRSplit is Python's str.rsplit: like split, but maxsplit counts from
// the right.
func pyRSplit(self string, v *exec.Value, args *exec.VarArgs) (any, error) {
	maxsplit := -1
	if len(args.Args) > 1 {
		maxsplit = args.Args[1].Integer()
	}
	if v, ok := args.KwArgs["maxsplit"]; ok {
		maxsplit = v.Integer()
	}
	kw := map[string]*exec.Value{}
	if sepArg, ok := args.KwArgs["sep"]; ok {
		kw["sep"] = sepArg
	}
	all, err := pySplit(self, v, &exec.VarArgs{Args: args.Args[:min(len(args.Args), 1)], KwArgs: kw})
	if err != nil || maxsplit < 0 {
		return all, err
	}
	parts := all.(pyList)
	if len(parts) <= maxsplit+1 {
		return parts, nil
	}
	sep, hasSep := "", len(args.Args) > 0 && !args.Args[0].IsNil()
	if hasSep {
		sep = args.Args[0].String()
	}
	if sepArg, ok := args.KwArgs["sep"]; ok && !sepArg.IsNil() {
		sep, hasSep = sepArg.String(), true
	}
	cut := len(self)
	for range maxsplit {
		if hasSep {
			cut = strings.LastIndex(self[:cut], sep)
		} else {
			trimmed := strings.TrimRightFunc(self[:cut], unicode.IsSpace)
			cut = strings.LastIndexFunc(trimmed, unicode.IsSpace)
		}
	}
	head := strings.TrimRightFunc(self[:cut], unicode.IsSpace)
	if hasSep {
		head = self[:cut]
	}
	out := pyList{head}
	return append(out, parts[len(parts)-maxsplit:]...), nil
}

// pyStrip is Python's str.strip, lstrip or rstrip: whitespace without an
// argument (or None), else the given characters.
func pyStrip(name string) exec.Method[string] {
	return func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
		trimLeft := name != "rstrip"
		trimRight := name != "lstrip"
		chars, hasChars := "", false
		if len(args.Args) > 0 && !args.Args[0].IsNil() {
			chars, hasChars = args.Args[0].String(), true
		}
		if trimLeft {
			if hasChars {
				self = strings.TrimLeft(self, chars)
			} else {
				self = strings.TrimLeftFunc(self, unicode.IsSpace)
			}
		}
		if trimRight {
			if hasChars {
				self = strings.TrimRight(self, chars)
			} else {
				self = strings.TrimRightFunc(self, unicode.IsSpace)
			}
		}
		return self, nil
	}
}

// pyReplace is Python's str.replace(old, new, count=-1).
func pyReplace(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
	if len(args.Args) < 2 {
		return nil, errors.New("replace expects old and new")
	}
	count := -1
	if len(args.Args) > 2 {
		count = args.Args[2].Integer()
	}
	if v, ok := args.KwArgs["count"]; ok {
		count = v.Integer()
	}
	return strings.Replace(self, args.Args[0].String(), args.Args[1].String(), count), nil
}
