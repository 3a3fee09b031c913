package grammar

import (
	"encoding/json"
	"errors"
	"math"
	"regexp/syntax"
	"sort"
	"strconv"
	"strings"

	"github.com/mlxserving/mlxserving/internal/lru"
)

type kind uint8

const (
	kAny kind = iota // any JSON value
	kObject
	kArray
	kString
	kNumber
	kInteger
	kBool
	kNull
	kLiteral // const or enum: one of lits, JSON-encoded
	kUnion   // anyOf or a list of types
)

// node is one compiled schema. Nodes may form cycles through $ref.
type node struct {
	kind kind

	// object
	props    []prop
	free     bool  // keys are free strings (no declared properties)
	extra    *node // value schema of free keys (kAny when unconstrained)
	keyMax   int   // most characters in a free key (propertyNames maxLength); 0: Limits.MaxStringLength
	minProps int
	maxProps int

	// array
	items    *node
	minItems int
	maxItems int

	// string
	minLen, maxLen int
	re             *regex

	// number / integer
	hasMin, hasMax bool
	exMin, exMax   bool
	min, max       float64

	lits []string // literal: JSON encodings
	alts []*node  // union
}

type prop struct {
	name     string
	key      string // JSON-encoded name without its opening quote: `name"`
	n        *node
	required bool
}

func (n *node) bounded() bool { return n.hasMin || n.hasMax }

// compiler turns a decoded schema into nodes.
type compiler struct {
	root  map[string]any
	lim   Limits
	refs  map[string]*node
	depth int
	// regexes shares compiled patterns across the schemas of one
	// vocabulary; nil compiles every pattern afresh (Check).
	regexes *lru.Shared[string, *regex]
}

// keywords that only annotate and never constrain.
var annotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true,
	"$schema": true, "$id": true, "$comment": true, "strict": true,
	"deprecated": true, "readOnly": true, "writeOnly": true,
	"$defs": true, "definitions": true, orderKey: true,
}

func (c *compiler) compile(v any, path string) (*node, error) {
	c.depth++
	defer func() { c.depth-- }()
	if c.depth > 64 {
		return nil, &SchemaError{Path: path, Reason: "schema nested deeper than 64 levels"}
	}
	switch s := v.(type) {
	case bool:
		if s {
			return &node{kind: kAny}, nil
		}
		return nil, &UnsupportedError{Keyword: "false", Path: path}
	case map[string]any:
		return c.compileObject(s, path)
	}
	return nil, &SchemaError{Path: path, Reason: "a schema must be an object or a boolean"}
}

func (c *compiler) compileObject(s map[string]any, path string) (*node, error) {
	if ref, ok := s["$ref"]; ok {
		for k := range s {
			if k != "$ref" && !annotations[k] {
				return nil, &UnsupportedError{Keyword: "$ref with " + k, Path: path}
			}
		}
		r, ok := ref.(string)
		if !ok {
			return nil, &SchemaError{Path: path, Reason: "$ref must be a string"}
		}
		return c.resolve(r, path)
	}
	if v, ok := s["const"]; ok {
		lit, err := canonical(v)
		if err != nil {
			return nil, &SchemaError{Path: path + "/const", Reason: err.Error()}
		}
		return &node{kind: kLiteral, lits: []string{lit}}, nil
	}
	if v, ok := s["enum"]; ok {
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return nil, &SchemaError{Path: path + "/enum", Reason: "enum must be a non-empty array"}
		}
		n := &node{kind: kLiteral}
		for _, e := range list {
			lit, err := canonical(e)
			if err != nil {
				return nil, &SchemaError{Path: path + "/enum", Reason: err.Error()}
			}
			n.lits = append(n.lits, lit)
		}
		return n, nil
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		v, ok := s[k]
		if !ok {
			continue
		}
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return nil, &SchemaError{Path: path + "/" + k, Reason: k + " must be a non-empty array"}
		}
		if k == "oneOf" && !exclusive(list) {
			return nil, &UnsupportedError{Keyword: "oneOf whose alternatives may overlap", Path: path}
		}
		u := &node{kind: kUnion}
		for i, e := range list {
			a, err := c.compile(e, path+"/"+k+"/"+strconv.Itoa(i))
			if err != nil {
				return nil, err
			}
			u.alts = append(u.alts, a)
		}
		return u, nil
	}
	return c.compileTyped(s, path)
}

func (c *compiler) compileTyped(s map[string]any, path string) (*node, error) {
	var types []string
	switch t := s["type"].(type) {
	case nil:
		if _, ok := s["type"]; ok {
			return nil, &SchemaError{Path: path, Reason: "type must be a string or an array of strings"}
		}
		if _, ok := s["properties"]; ok {
			types = []string{"object"}
		} else if _, ok := s["items"]; ok {
			types = []string{"array"}
		}
	case string:
		types = []string{t}
	case []any:
		for _, e := range t {
			str, ok := e.(string)
			if !ok {
				return nil, &SchemaError{Path: path + "/type", Reason: "type list must hold strings"}
			}
			types = append(types, str)
		}
	default:
		return nil, &SchemaError{Path: path + "/type", Reason: "type must be a string or an array of strings"}
	}
	if err := c.checkKeywords(s, path); err != nil {
		return nil, err
	}
	if len(types) == 0 {
		if len(s) > 0 && !onlyAnnotations(s) {
			return nil, &SchemaError{Path: path, Reason: "constraints without a type"}
		}
		return &node{kind: kAny}, nil
	}
	u := &node{kind: kUnion}
	for _, t := range types {
		n, err := c.compileType(t, s, path)
		if err != nil {
			return nil, err
		}
		u.alts = append(u.alts, n)
	}
	if len(u.alts) == 1 {
		return u.alts[0], nil
	}
	return u, nil
}

var supported = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true, "propertyNames": true,
	"items": true, "minItems": true, "maxItems": true, "minLength": true, "maxLength": true,
	"pattern": true, "format": true, "minimum": true, "maximum": true,
	"exclusiveMinimum": true, "exclusiveMaximum": true, "minProperties": true, "maxProperties": true,
}

func onlyAnnotations(s map[string]any) bool {
	for k := range s {
		if !annotations[k] {
			return false
		}
	}
	return true
}

func (c *compiler) checkKeywords(s map[string]any, path string) error {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !supported[k] && !annotations[k] {
			return &UnsupportedError{Keyword: k, Path: path}
		}
	}
	return nil
}

func (c *compiler) compileType(t string, s map[string]any, path string) (*node, error) {
	switch t {
	case "object":
		return c.compileObj(s, path)
	case "array":
		n := &node{kind: kArray, maxItems: -1}
		items, ok := s["items"]
		if !ok {
			items = true
		}
		var err error
		if n.items, err = c.compile(items, path+"/items"); err != nil {
			return nil, err
		}
		if n.minItems, n.maxItems, err = intRange(s, "minItems", "maxItems", path); err != nil {
			return nil, err
		}
		return n, nil
	case "string":
		return c.compileString(s, path)
	case "number", "integer":
		n := &node{kind: kNumber}
		if t == "integer" {
			n.kind = kInteger
		}
		return n, numBounds(n, s, path)
	case "boolean":
		return &node{kind: kBool}, nil
	case "null":
		return &node{kind: kNull}, nil
	}
	return nil, &SchemaError{Path: path + "/type", Reason: "unknown type " + strconv.Quote(t)}
}

func (c *compiler) compileObj(s map[string]any, path string) (*node, error) {
	n := &node{kind: kObject}
	var err error
	if n.minProps, n.maxProps, err = intRange(s, "minProperties", "maxProperties", path); err != nil {
		return nil, err
	}
	props, _ := s["properties"].(map[string]any)
	if _, ok := s["properties"]; ok && props == nil {
		return nil, &SchemaError{Path: path + "/properties", Reason: "properties must be an object"}
	}
	required := map[string]bool{}
	if r, ok := s["required"]; ok {
		list, ok := r.([]any)
		if !ok {
			return nil, &SchemaError{Path: path + "/required", Reason: "required must be an array of strings"}
		}
		for _, e := range list {
			name, ok := e.(string)
			if !ok {
				return nil, &SchemaError{Path: path + "/required", Reason: "required must be an array of strings"}
			}
			required[name] = true
			if _, ok := props[name]; !ok {
				if props == nil {
					props = map[string]any{}
				}
				props[name] = true
			}
		}
	}
	for _, name := range propertyOrder(props) {
		pn, err := c.compile(props[name], path+"/properties/"+escapePointer(name))
		if err != nil {
			return nil, err
		}
		enc, _ := json.Marshal(name)
		n.props = append(n.props, prop{name: name, key: string(enc[1:]), n: pn, required: required[name]})
	}
	if n.minProps > 0 && len(n.props) > 0 {
		return nil, &UnsupportedError{Keyword: "minProperties", Path: path}
	}
	if n.keyMax, err = checkPropertyNames(s, path); err != nil {
		return nil, err
	}
	if len(n.props) == 0 {
		n.free = true
		n.extra = &node{kind: kAny}
		if ap, ok := s["additionalProperties"]; ok {
			if b, isBool := ap.(bool); isBool && !b {
				n.free = false // only {} matches
			} else if n.extra, err = c.compile(ap, path+"/additionalProperties"); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

// checkPropertyNames accepts a propertyNames that asks only for strings
// (zod v4's z.record(z.string(), ...) sends {"type": "string"}: property
// names are strings anyway), with a maxLength if it likes
// (z.record(z.string().max(12), ...)), which bounds free keys and is
// returned (0: none). Anything narrower is refused by name.
func checkPropertyNames(s map[string]any, path string) (int, error) {
	pn, ok := s["propertyNames"]
	if !ok {
		return 0, nil
	}
	switch v := pn.(type) {
	case bool:
		if v {
			return 0, nil
		}
	case map[string]any:
		narrow, keyMax := false, 0
		for k, x := range v {
			if annotations[k] {
				continue
			}
			if t, isStr := x.(string); k == "type" && isStr && t == "string" {
				continue
			}
			if k == "maxLength" {
				if _, most, err := intRange(v, "minLength", "maxLength", path+"/propertyNames"); err == nil && most >= 1 {
					keyMax = most
					continue
				}
			}
			narrow = true
		}
		if !narrow {
			return keyMax, nil
		}
	}
	return 0, &UnsupportedError{Keyword: "propertyNames beyond {\"type\": \"string\", \"maxLength\": n}", Path: path}
}

// propertyOrder lists property names in the order the schema text gives
// them, then any others (required names without a property) sorted.
func propertyOrder(props map[string]any) []string {
	names := make([]string, 0, len(props))
	if order, ok := props[orderKey].([]string); ok {
		seen := map[string]bool{}
		for _, k := range order {
			if _, ok := props[k]; ok && !seen[k] {
				names = append(names, k)
				seen[k] = true
			}
		}
		var rest []string
		for k := range props {
			if !seen[k] && k != orderKey {
				rest = append(rest, k)
			}
		}
		sort.Strings(rest)
		return append(names, rest...)
	}
	for k := range props {
		if k != orderKey {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names
}

func (c *compiler) compileString(s map[string]any, path string) (*node, error) {
	n := &node{kind: kString}
	var err error
	if n.minLen, n.maxLen, err = intRange(s, "minLength", "maxLength", path); err != nil {
		return nil, err
	}
	pattern, hasPattern := s["pattern"].(string)
	if _, ok := s["pattern"]; ok && !hasPattern {
		return nil, &SchemaError{Path: path + "/pattern", Reason: "pattern must be a string"}
	}
	if f, ok := s["format"]; ok {
		name, _ := f.(string)
		p, known := formats[name]
		if !known {
			return nil, &UnsupportedError{Keyword: "format: " + name, Path: path}
		}
		var bound int
		if n.re, bound, err = c.formatWithPattern(p, pattern, hasPattern); err != nil {
			return nil, &UnsupportedError{Keyword: "pattern: " + err.Error(), Path: path}
		}
		if bound >= 0 && (n.maxLen < 0 || n.maxLen > bound) {
			n.maxLen = max(bound, n.minLen)
		}
		return n, nil
	}
	if hasPattern {
		if n.re, err = c.regex(pattern); err != nil {
			return nil, &UnsupportedError{Keyword: "pattern: " + err.Error(), Path: path}
		}
	}
	return n, nil
}

// formatWithPattern is the automaton of a string with a format and,
// maybe, a pattern (zod v4 sends both for z.email(), z.uuid(), z.iso.*()),
// and the most characters such a string may have (-1: no bound beyond the
// automaton's). Both must hold, so the automaton is their intersection
// (compileIntersect). When the pattern uses what RE2 cannot express (zod's
// duration pattern has lookaheads) the format's own grammar is used: the
// formats' grammars generate only values every validator of the format
// accepts, zod's patterns included. When the intersection has too many
// states, the pattern governs, bounded by the format's longest value.
func (c *compiler) formatWithPattern(format, pattern string, hasPattern bool) (*regex, int, error) {
	f, err := c.regex(format)
	if err != nil || !hasPattern {
		return f, -1, err
	}
	both, err := c.intersect(pattern, format)
	var perr *syntax.Error
	switch {
	case err == nil:
		return both, -1, nil
	case errors.As(err, &perr):
		return f, -1, nil
	case errors.Is(err, errProductTooLarge):
		re, err := c.regex(pattern)
		return re, f.maxLen, err
	default:
		return nil, 0, err
	}
}

func intRange(s map[string]any, lo, hi, path string) (int, int, error) {
	get := func(k string, def int) (int, error) {
		v, ok := s[k]
		if !ok {
			return def, nil
		}
		num, ok := v.(json.Number)
		if !ok {
			return 0, &SchemaError{Path: path + "/" + k, Reason: k + " must be a non-negative integer"}
		}
		i, err := strconv.ParseInt(num.String(), 10, 32)
		if err != nil || i < 0 {
			return 0, &SchemaError{Path: path + "/" + k, Reason: k + " must be a non-negative integer"}
		}
		return int(i), nil
	}
	a, err := get(lo, 0)
	if err != nil {
		return 0, 0, err
	}
	b, err := get(hi, -1)
	if err != nil {
		return 0, 0, err
	}
	if b >= 0 && a > b {
		return 0, 0, &SchemaError{Path: path, Reason: lo + " is greater than " + hi}
	}
	return a, b, nil
}

func numBounds(n *node, s map[string]any, path string) error {
	get := func(k string) (float64, bool, error) {
		v, ok := s[k]
		if !ok {
			return 0, false, nil
		}
		num, ok := v.(json.Number)
		if !ok {
			return 0, false, &SchemaError{Path: path + "/" + k, Reason: k + " must be a number"}
		}
		f, err := num.Float64()
		if err != nil || math.IsInf(f, 0) {
			return 0, false, &SchemaError{Path: path + "/" + k, Reason: k + " must be a finite number"}
		}
		return f, true, nil
	}
	var err error
	var ok bool
	var f float64
	if n.min, n.hasMin, err = get("minimum"); err != nil {
		return err
	}
	if f, ok, err = get("exclusiveMinimum"); err != nil {
		return err
	} else if ok && (!n.hasMin || f >= n.min) {
		n.min, n.hasMin, n.exMin = f, true, true
	}
	if n.max, n.hasMax, err = get("maximum"); err != nil {
		return err
	}
	if f, ok, err = get("exclusiveMaximum"); err != nil {
		return err
	} else if ok && (!n.hasMax || f <= n.max) {
		n.max, n.hasMax, n.exMax = f, true, true
	}
	if n.hasMin && n.hasMax && (n.min > n.max || (n.min == n.max && (n.exMin || n.exMax))) {
		return &SchemaError{Path: path, Reason: "no number lies between the bounds"}
	}
	if n.kind == kInteger && n.hasMin && n.hasMax && math.Floor(n.max) < math.Ceil(n.min) {
		return &SchemaError{Path: path, Reason: "no integer lies between the bounds"}
	}
	return nil
}

func (c *compiler) resolve(ref, path string) (*node, error) {
	if n, ok := c.refs[ref]; ok {
		return n, nil
	}
	if !strings.HasPrefix(ref, "#") {
		return nil, &UnsupportedError{Keyword: "$ref: " + ref, Path: path}
	}
	var target any = c.root
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#"), "/")[1:] {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		m, ok := target.(map[string]any)
		if !ok {
			return nil, &SchemaError{Path: path, Reason: "$ref " + ref + " does not resolve"}
		}
		if target, ok = m[part]; !ok {
			return nil, &SchemaError{Path: path, Reason: "$ref " + ref + " does not resolve"}
		}
	}
	// A placeholder breaks cycles: recursive references share it.
	n := &node{}
	c.refs[ref] = n
	got, err := c.compile(target, strings.TrimPrefix(ref, "#"))
	if err != nil {
		delete(c.refs, ref)
		return nil, err
	}
	if got == n {
		return nil, &SchemaError{Path: path, Reason: "$ref " + ref + " refers to itself"}
	}
	*n = *got
	return n, nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
