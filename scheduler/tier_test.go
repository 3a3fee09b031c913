package scheduler_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/scheduler"
)

func TestParseTier(t *testing.T) {
	tests := []struct {
		in   string
		want scheduler.Tier
		err  bool
	}{
		{"critical", scheduler.Critical, false},
		{"HIGH", scheduler.High, false},
		{" Normal ", scheduler.Normal, false},
		{"low", scheduler.Low, false},
		{"background", scheduler.Background, false},
		{"", 0, true},
		{"urgent", 0, true},
		{"3", 0, true},
	}
	for _, tt := range tests {
		got, err := scheduler.ParseTier(tt.in)
		if tt.err {
			var ute *scheduler.UnknownTierError
			if !errors.Is(err, scheduler.ErrUnknownTier) || !errors.As(err, &ute) || ute.Value != tt.in {
				t.Errorf("ParseTier(%q) error = %v, want *UnknownTierError{%q}", tt.in, err, tt.in)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseTier(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if back, _ := scheduler.ParseTier(got.String()); back != got {
			t.Errorf("ParseTier(%v.String()) = %v", got, back)
		}
	}
}

func TestTierOrder(t *testing.T) {
	tiers := scheduler.Tiers()
	want := []scheduler.Tier{scheduler.Critical, scheduler.High, scheduler.Normal, scheduler.Low, scheduler.Background}
	if !slices.Equal(tiers, want) {
		t.Fatalf("Tiers() = %v, want %v", tiers, want)
	}
	for i, a := range tiers {
		if !a.Valid() {
			t.Errorf("%v.Valid() = false", a)
		}
		for j, b := range tiers {
			if got := a.Outranks(b); got != (i < j) {
				t.Errorf("%v.Outranks(%v) = %v", a, b, got)
			}
		}
	}
	var zero scheduler.Tier
	if zero != scheduler.Normal {
		t.Errorf("zero Tier = %v, want normal", zero)
	}
	bad := scheduler.Tier(200)
	if bad.Valid() || bad.Outranks(scheduler.Background) || !scheduler.Background.Outranks(bad) {
		t.Errorf("invalid tier: Valid %v, outranks background %v", bad.Valid(), bad.Outranks(scheduler.Background))
	}
	if bad.String() != "Tier(200)" {
		t.Errorf("String() = %q", bad.String())
	}
}

func TestTierText(t *testing.T) {
	for _, tier := range scheduler.Tiers() {
		b, err := tier.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got scheduler.Tier
		if err := got.UnmarshalText(b); err != nil || got != tier {
			t.Errorf("round trip of %v: %v, %v", tier, got, err)
		}
	}
	if _, err := scheduler.Tier(9).MarshalText(); !errors.Is(err, scheduler.ErrUnknownTier) {
		t.Errorf("MarshalText(Tier(9)) error = %v", err)
	}
	var got scheduler.Tier = scheduler.High
	if err := got.UnmarshalText([]byte("top")); !errors.Is(err, scheduler.ErrUnknownTier) || got != scheduler.High {
		t.Errorf("UnmarshalText(top) = %v, %v", got, err)
	}
}
