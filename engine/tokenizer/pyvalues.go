package tokenizer

import (
	"errors"
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
