package grammar

// advObject feeds c to an object frame.
func (w *walker) advObject(s *stk, c byte, out []*stk) []*stk {
	f := &s.f
	n := f.n
	if f.st == oKey {
		if f.lit[f.i] != c {
			return out
		}
		nf := *f
		nf.i++
		if int(nf.i) == len(nf.lit) {
			nf.st, nf.ws, nf.i = oColon, 0, nf.j+1
		}
		return append(out, w.mk(nf, s.up))
	}
	if isWS(c) {
		return w.ws(s, out)
	}
	switch {
	case c == '"' && (f.st == oOpen || f.st == oComma):
		return w.key(s, out)
	case c == '}' && (f.st == oOpen || f.st == oAfter):
		if w.objCanClose(f) {
			return append(out, w.pop(s))
		}
	case c == ',' && f.st == oAfter:
		if w.objMoreKeys(f) {
			nf := *f
			nf.st, nf.ws = oComma, 0
			return append(out, w.mk(nf, s.up))
		}
	case c == ':' && f.st == oColon:
		nf := *f
		nf.st, nf.ws = oAfter, 0
		vn := n.extra
		if !n.free {
			vn = n.props[f.j].n
		}
		parent := w.mk(nf, s.up)
		return append(out, w.mk(frame{kind: fValue, n: vn, depth: f.depth, vals: f.vals}, parent))
	}
	return out
}

// key starts a property name after its opening quote.
func (w *walker) key(s *stk, out []*stk) []*stk {
	f := &s.f
	n := f.n
	if n.free {
		// After a comma the key is due, even once the document closes.
		if f.st != oComma && !w.objMoreKeys(f) {
			return out
		}
		nf := *f
		nf.st, nf.ws = oColon, 0
		nf.i++
		parent := w.mk(nf, s.up)
		keyMax := w.g.lim.MaxStringLength
		if n.keyMax > 0 {
			keyMax = n.keyMax
		}
		kf := frame{kind: fString, n: freeString, depth: f.depth, vals: f.vals, maxChars: int32(keyMax)}
		return append(out, w.mk(kf, parent))
	}
	capped := w.capped(f.depth, f.vals)
	for j := int(f.i); j < len(n.props); j++ {
		p := &n.props[j]
		if !p.required && capped {
			continue
		}
		nf := *f
		nf.st, nf.ws, nf.lit, nf.i, nf.j = oKey, 0, p.key, 0, int32(j)
		out = append(out, w.mk(nf, s.up))
		if p.required {
			break
		}
	}
	return out
}

func (w *walker) objCanClose(f *frame) bool {
	n := f.n
	if n.free {
		return int(f.i) >= n.minProps
	}
	for j := int(f.i); j < len(n.props); j++ {
		if n.props[j].required {
			return false
		}
	}
	return true
}

func (w *walker) objMoreKeys(f *frame) bool {
	n := f.n
	if n.free {
		if n.extra == nil {
			return false
		}
		limit := n.maxProps
		if limit < 0 {
			limit = max(w.g.lim.MaxProperties, n.minProps)
		}
		if int(f.i) >= limit {
			return false
		}
		return int(f.i) < n.minProps || !(w.capped(f.depth, f.vals) || w.closing)
	}
	capped := w.capped(f.depth, f.vals)
	for j := int(f.i); j < len(n.props); j++ {
		if n.props[j].required || !capped {
			return true
		}
	}
	return false
}

// advArray feeds c to an array frame.
func (w *walker) advArray(s *stk, c byte, out []*stk) []*stk {
	f := &s.f
	if isWS(c) {
		return w.ws(s, out)
	}
	switch {
	case c == ']':
		if int(f.i) >= f.n.minItems {
			return append(out, w.pop(s))
		}
		return out
	case c == ',':
		if f.st == aAfter && w.arrMore(f) {
			nf := *f
			nf.ws = 0
			nf.i++
			parent := w.mk(nf, s.up)
			return append(out, w.mk(frame{kind: fValue, n: f.n.items, depth: f.depth, vals: f.vals}, parent))
		}
		return out
	}
	if f.st != aOpen || !w.arrMore(f) {
		return out
	}
	nf := *f
	nf.st, nf.ws, nf.i = aAfter, 0, 1
	return w.start(w.mk(nf, s.up), f.n.items, f.depth, f.vals, c, out)
}

func (w *walker) arrMore(f *frame) bool {
	n := f.n
	limit := n.maxItems
	if limit < 0 {
		limit = max(w.g.lim.MaxItems, n.minItems)
	}
	if int(f.i) >= limit {
		return false
	}
	return int(f.i) < n.minItems || !(w.capped(f.depth, f.vals) || (w.closing && n.items.kind == kAny))
}

// advString feeds c to a string frame.
func (w *walker) advString(s *stk, c byte, out []*stk) []*stk {
	f := &s.f
	switch f.st {
	case sEsc:
		nf := *f
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			nf.st = sBody
			nf.i++
		case 'u':
			nf.st, nf.j, nf.surr = sHex, 4, false
		default:
			return out
		}
		return append(out, w.mk(nf, s.up))
	case sHex:
		if !isHex(c) {
			return out
		}
		nf := *f
		if f.j == 4 {
			nf.surr = c == 'd' || c == 'D'
		} else if f.j == 3 && f.surr && (c >= '8' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return out // lone surrogates are refused by many parsers
		}
		nf.j--
		if nf.j == 0 {
			nf.st = sBody
			nf.i++
		}
		return append(out, w.mk(nf, s.up))
	}
	if f.u8need > 0 {
		if c < f.u8lo || c > f.u8hi {
			return out
		}
		nf := *f
		nf.u8buf[nf.u8n] = c
		nf.u8n++
		nf.u8need--
		nf.u8lo, nf.u8hi = 0x80, 0xBF
		if nf.u8need == 0 {
			nf.i++
			if nf.re != nil {
				if nf.re = f.n.re.step(nf.re, decodeRune(nf.u8buf[:nf.u8n])); nf.re == nil || nf.re.dist > nf.maxChars-nf.i {
					return out
				}
			}
		} else if nf.re != nil && !f.n.re.accepts(nf.re, partialRunes(&nf), nf.maxChars-nf.i) {
			return out
		}
		return append(out, w.mk(nf, s.up))
	}
	switch {
	case c == '"':
		if int(f.i) < f.n.minLen || (f.re != nil && !f.re.match) {
			return out
		}
		return append(out, w.pop(s))
	case c < 0x20 || w.room(f) <= 0:
		return out
	case c == '\\':
		if f.re != nil {
			return out
		}
		nf := *f
		nf.st = sEsc
		return append(out, w.mk(nf, s.up))
	case c < 0x80:
		nf := *f
		nf.i++
		if nf.re != nil {
			if nf.re = f.n.re.step(nf.re, rune(c)); nf.re == nil || nf.re.dist > nf.maxChars-nf.i {
				return out
			}
		}
		return append(out, w.mk(nf, s.up))
	}
	need, lo, hi := utf8Lead(c)
	if need == 0 {
		return out
	}
	nf := *f
	nf.u8need, nf.u8lo, nf.u8hi = need, lo, hi
	nf.u8buf[0], nf.u8n = c, 1
	if nf.re != nil && !f.n.re.accepts(nf.re, partialRunes(&nf), nf.maxChars-nf.i) {
		return out
	}
	return append(out, w.mk(nf, s.up))
}

func partialRunes(f *frame) [2]rune {
	lo, hi := partialRange(f.u8buf[:f.u8n], f.u8lo, f.u8hi, int(f.u8need))
	return [2]rune{lo, hi}
}

// utf8Lead returns how many continuation bytes follow lead byte c and the
// range of the first one, as utf8.Valid requires; need is 0 for a byte
// that cannot start a character.
func utf8Lead(c byte) (need, lo, hi uint8) {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 1, 0x80, 0xBF
	case c == 0xE0:
		return 2, 0xA0, 0xBF
	case c == 0xED:
		return 2, 0x80, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		return 2, 0x80, 0xBF
	case c == 0xF0:
		return 3, 0x90, 0xBF
	case c >= 0xF1 && c <= 0xF3:
		return 3, 0x80, 0xBF
	case c == 0xF4:
		return 3, 0x80, 0x8F
	}
	return 0, 0, 0
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
