package scheduler

import (
	"fmt"
	"strings"
)

// Tier is a priority class. Higher tiers run first; compare tiers with
// [Tier.Outranks], never by their numbers (the numbers are not in rank
// order: the zero value is Normal, so a request that names no tier is
// ordinary work).
type Tier uint8

// The tiers, from the zero value on. Their rank, most urgent first, is
// Critical, High, Normal, Low, Background; see [Tiers].
const (
	// Normal is ordinary interactive work, and the zero value.
	Normal Tier = iota
	// Background is work that may wait indefinitely behind everything
	// else, kept from starving only by aging.
	Background
	// Low is work that tolerates seconds of queueing.
	Low
	// High is latency-sensitive work.
	High
	// Critical is work that must start within its SLA; it is the only
	// tier that may preempt running sequences.
	Critical
)

// numTiers is the number of valid tiers; ranks run 0..numTiers-1.
const numTiers = 5

// Rank numbers, least urgent first, used to index per-tier tables.
const (
	rankBackground = iota
	rankLow
	rankNormal
	rankHigh
	rankCritical
)

// Tiers returns every tier, most urgent first.
func Tiers() []Tier { return []Tier{Critical, High, Normal, Low, Background} }

// tierOfRank is the inverse of Tier.rank.
func tierOfRank(r int) Tier {
	return [numTiers]Tier{Background, Low, Normal, High, Critical}[r]
}

// rank orders tiers: 0 is Background, 4 is Critical, -1 is invalid.
func (t Tier) rank() int {
	switch t {
	case Background:
		return rankBackground
	case Low:
		return rankLow
	case Normal:
		return rankNormal
	case High:
		return rankHigh
	case Critical:
		return rankCritical
	}
	return -1
}

// Valid reports whether t is one of the named tiers.
func (t Tier) Valid() bool { return t.rank() >= 0 }

// Outranks reports whether t runs before o. An invalid tier outranks
// nothing and is outranked by every valid one.
func (t Tier) Outranks(o Tier) bool { return t.rank() > o.rank() }

// String returns the tier's name as [ParseTier] reads it, or "Tier(N)" for
// an invalid value.
func (t Tier) String() string {
	switch t {
	case Background:
		return "background"
	case Low:
		return "low"
	case Normal:
		return "normal"
	case High:
		return "high"
	case Critical:
		return "critical"
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

// ParseTier reads a tier name ("critical", "high", "normal", "low",
// "background"), ignoring case and surrounding spaces. Anything else,
// the empty string included, returns an *UnknownTierError; callers that
// treat a missing priority as ordinary work use the zero value, Normal.
func ParseTier(s string) (Tier, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "background":
		return Background, nil
	case "low":
		return Low, nil
	case "normal":
		return Normal, nil
	case "high":
		return High, nil
	case "critical":
		return Critical, nil
	}
	return Normal, &UnknownTierError{Value: s}
}

// MarshalText encodes a valid tier as its name.
func (t Tier) MarshalText() ([]byte, error) {
	if !t.Valid() {
		return nil, &UnknownTierError{Value: t.String()}
	}
	return []byte(t.String()), nil
}

// UnmarshalText decodes a tier name as [ParseTier] does.
func (t *Tier) UnmarshalText(b []byte) error {
	v, err := ParseTier(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}
