package api_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/api"
)

func TestParseTier(t *testing.T) {
	tests := []struct {
		in   string
		want api.Tier
		err  bool
	}{
		{"critical", api.Critical, false},
		{"HIGH", api.High, false},
		{" Normal ", api.Normal, false},
		{"low", api.Low, false},
		{"background", api.Background, false},
		{"", 0, true},
		{"urgent", 0, true},
		{"3", 0, true},
	}
	for _, tt := range tests {
		got, err := api.ParseTier(tt.in)
		if tt.err {
			var ute *api.UnknownTierError
			if !errors.Is(err, api.ErrUnknownTier) || !errors.As(err, &ute) || ute.Value != tt.in {
				t.Errorf("ParseTier(%q) error = %v, want *UnknownTierError{%q}", tt.in, err, tt.in)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseTier(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if back, _ := api.ParseTier(got.String()); back != got {
			t.Errorf("ParseTier(%v.String()) = %v", got, back)
		}
	}
}

func TestTierOrder(t *testing.T) {
	tiers := api.Tiers()
	want := []api.Tier{api.Critical, api.High, api.Normal, api.Low, api.Background}
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
	var zero api.Tier
	if zero != api.Normal {
		t.Errorf("zero Tier = %v, want normal", zero)
	}
	bad := api.Tier(200)
	if bad.Valid() || bad.Outranks(api.Background) || !api.Background.Outranks(bad) {
		t.Errorf("invalid tier: Valid %v, outranks background %v", bad.Valid(), bad.Outranks(api.Background))
	}
	if bad.String() != "Tier(200)" {
		t.Errorf("String() = %q", bad.String())
	}
}

func TestTierText(t *testing.T) {
	for _, tier := range api.Tiers() {
		b, err := tier.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got api.Tier
		if err := got.UnmarshalText(b); err != nil || got != tier {
			t.Errorf("round trip of %v: %v, %v", tier, got, err)
		}
	}
	if _, err := api.Tier(9).MarshalText(); !errors.Is(err, api.ErrUnknownTier) {
		t.Errorf("MarshalText(Tier(9)) error = %v", err)
	}
	var got api.Tier = api.High
	if err := got.UnmarshalText([]byte("top")); !errors.Is(err, api.ErrUnknownTier) || got != api.High {
		t.Errorf("UnmarshalText(top) = %v, %v", got, err)
	}
}
