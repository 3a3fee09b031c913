package api

import (
	"errors"
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

// NumTiers is the number of valid tiers; ranks run 0..NumTiers-1.
const NumTiers = 5

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

// TierOfRank is the inverse of [Tier.Rank]; r must be in [0, NumTiers).
func TierOfRank(r int) Tier {
	return [NumTiers]Tier{Background, Low, Normal, High, Critical}[r]
}

// Rank orders tiers for per-tier tables: 0 is Background, NumTiers-1 is
// Critical, -1 is invalid.
func (t Tier) Rank() int {
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
func (t Tier) Valid() bool { return t.Rank() >= 0 }

// Outranks reports whether t runs before o. An invalid tier outranks
// nothing and is outranked by every valid one.
func (t Tier) Outranks(o Tier) bool { return t.Rank() > o.Rank() }

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

// ErrUnknownTier means a tier name or value is not one of the tiers.
var ErrUnknownTier = errors.New("unknown tier")

// UnknownTierError names a value that is not a tier.
type UnknownTierError struct {
	// Value is the name or "Tier(N)" that was not recognised.
	Value string
}

func (e *UnknownTierError) Error() string {
	return fmt.Sprintf("unknown tier %q: want critical, high, normal, low or background", e.Value)
}

// Unwrap returns ErrUnknownTier.
func (e *UnknownTierError) Unwrap() error { return ErrUnknownTier }
