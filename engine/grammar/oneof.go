package grammar

// oneOf asks for exactly one alternative to match. Generating any one of
// them (as for anyOf) is exact when no value can match two: alternatives
// told apart by a required property whose const or enum values differ
// (zod v4's discriminated unions), or of distinct single types. Other
// oneOf lists are refused.

// exclusive reports whether no JSON value matches two schemas of list.
func exclusive(list []any) bool {
	return byType(list) || byDiscriminator(list)
}

// byType: every alternative has one type, and no two share it (integer
// counts as number).
func byType(list []any) bool {
	seen := map[string]bool{}
	for _, e := range list {
		s, ok := e.(map[string]any)
		if !ok {
			return false
		}
		t, ok := s["type"].(string)
		if !ok {
			return false
		}
		if t == "integer" {
			t = "number"
		}
		if seen[t] {
			return false
		}
		seen[t] = true
	}
	return true
}

// byDiscriminator: some property of the first alternative discriminates.
func byDiscriminator(list []any) bool {
	first, _ := list[0].(map[string]any)
	props, _ := first["properties"].(map[string]any)
	for name := range props {
		if name != orderKey && discriminates(list, name) {
			return true
		}
	}
	return false
}

// discriminates reports whether every alternative is an object requiring
// property name with const or enum values no other alternative allows.
func discriminates(list []any, name string) bool {
	seen := map[string]int{}
	for i, e := range list {
		s, ok := e.(map[string]any)
		if !ok || !requires(s, name) {
			return false
		}
		if t, ok := s["type"]; ok && t != "object" {
			return false
		}
		props, _ := s["properties"].(map[string]any)
		p, _ := props[name].(map[string]any)
		vals := literals(p)
		if len(vals) == 0 {
			return false
		}
		for _, v := range vals {
			if j, ok := seen[v]; ok && j != i {
				return false
			}
			seen[v] = i
		}
	}
	return true
}

func requires(s map[string]any, name string) bool {
	req, _ := s["required"].([]any)
	for _, r := range req {
		if r == name {
			return true
		}
	}
	return false
}

// literals are the JSON encodings of the values schema p allows through
// const or enum; nil when it allows others.
func literals(p map[string]any) []string {
	var vals []any
	if v, ok := p["const"]; ok {
		vals = []any{v}
	} else if list, ok := p["enum"].([]any); ok {
		vals = list
	}
	var out []string
	for _, v := range vals {
		lit, err := canonical(v)
		if err != nil {
			return nil
		}
		out = append(out, lit)
	}
	return out
}
