package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Grapheme clusters (Unicode UAX #29, extended) for the Precompiled
// normalizer, which treats a cluster shorter than 6 bytes as one unit.
// The rules implemented are every rule that can join characters into a
// cluster shorter than 6 bytes, plus Hangul syllables and regional
// indicator pairs: CR LF (GB3), breaks around controls (GB4, GB5), Hangul
// (GB6-GB8), extending characters and ZWJ (GB9), spacing marks (GB9a),
// prepended characters (GB9b), regional indicator pairs (GB12, GB13).
// The emoji ZWJ rule (GB11) and the Indic conjunct rule (GB9c) only join
// clusters of 7 bytes or more, which the normalizer handles character by
// character whatever their extent, and are left out.

type graphemeClass uint8

const (
	gcOther graphemeClass = iota
	gcCR
	gcLF
	gcControl
	gcExtend
	gcZWJ
	gcSpacingMark
	gcPrepend
	gcL
	gcV
	gcT
	gcLV
	gcLVT
	gcRI
)

// spacingMarkExceptions are Mc characters whose Grapheme_Cluster_Break is
// not SpacingMark.
var spacingMarkExceptions = map[rune]bool{
	0x102B: true, 0x102C: true, 0x1038: true, 0x1062: true, 0x1063: true, 0x1064: true,
	0x1067: true, 0x1068: true, 0x1069: true, 0x106A: true, 0x106B: true, 0x106C: true, 0x106D: true,
	0x1083: true, 0x1087: true, 0x1088: true, 0x1089: true, 0x108A: true, 0x108B: true, 0x108C: true,
	0x108F: true, 0x109A: true, 0x109B: true, 0x109C: true, 0x1A61: true, 0x1A63: true, 0x1A64: true,
	0xAA7B: true, 0xAA7D: true, 0x11720: true, 0x11721: true,
}

func classify(r rune) graphemeClass {
	switch {
	case r == '\r':
		return gcCR
	case r == '\n':
		return gcLF
	case r < 0x7f:
		if r < ' ' {
			return gcControl
		}
		return gcOther
	case r == 0x200D:
		return gcZWJ
	case r >= 0x1F1E6 && r <= 0x1F1FF:
		return gcRI
	case r >= 0x1F3FB && r <= 0x1F3FF: // emoji modifiers
		return gcExtend
	case r >= 0xAC00 && r <= 0xD7A3:
		if (r-0xAC00)%28 == 0 {
			return gcLV
		}
		return gcLVT
	case r >= 0x1100 && r <= 0x115F, r >= 0xA960 && r <= 0xA97C:
		return gcL
	case r >= 0x1160 && r <= 0x11A7, r >= 0xD7B0 && r <= 0xD7C6:
		return gcV
	case r >= 0x11A8 && r <= 0x11FF, r >= 0xD7CB && r <= 0xD7FB:
		return gcT
	case unicode.In(r, unicode.Mn, unicode.Me, unicode.Other_Grapheme_Extend):
		return gcExtend
	case unicode.Is(unicode.Prepended_Concatenation_Mark, r),
		r == 0x0D4E, r == 0x111C2, r == 0x111C3, r == 0x11A3A, r >= 0x11A84 && r <= 0x11A89, r == 0x11D46, r == 0x11F02:
		return gcPrepend
	case unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp):
		return gcControl
	case r == 0x2065, r >= 0xFFF0 && r <= 0xFFF8, r >= 0xE0000 && r <= 0xE0FFF:
		return gcControl // unassigned default-ignorable code points
	case r == 0x0E33 || r == 0x0EB3:
		return gcSpacingMark
	case unicode.Is(unicode.Mc, r) && !spacingMarkExceptions[r]:
		return gcSpacingMark
	}
	return gcOther
}

// graphemeLen returns the length in bytes of the cluster s starts with.
func graphemeLen(s string) int {
	r, n := utf8.DecodeRuneInString(s)
	prev := classify(r)
	ris := 0
	if prev == gcRI {
		ris = 1
	}
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		c := classify(r)
		if !graphemeJoins(prev, c, ris) {
			break
		}
		if c == gcRI {
			ris++
		}
		prev = c
		n += size
	}
	return n
}

// graphemeJoins reports whether no cluster boundary falls between a
// character of class a and one of class b; ris counts the regional
// indicators of the cluster so far.
func graphemeJoins(a, b graphemeClass, ris int) bool {
	switch {
	case a == gcCR && b == gcLF:
		return true
	case a == gcCR || a == gcLF || a == gcControl, b == gcCR || b == gcLF || b == gcControl:
		return false
	case a == gcL && (b == gcL || b == gcV || b == gcLV || b == gcLVT),
		(a == gcLV || a == gcV) && (b == gcV || b == gcT),
		(a == gcLVT || a == gcT) && b == gcT:
		return true
	case b == gcExtend || b == gcZWJ || b == gcSpacingMark || a == gcPrepend:
		return true
	case a == gcRI && b == gcRI:
		return ris%2 == 1
	}
	return false
}
