package tokenizer

import (
	"errors"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"reflect"
	"sort"

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
		case "split", "rsplit", "splitlines":
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
