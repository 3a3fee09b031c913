package scheduler

import (
	"testing"

	"github.com/mlxserving/mlxserving/api"
)

// The scheduler's rank constants index its tables the way api.Tier.Rank
// numbers the tiers.
func TestRanksMatchAPI(t *testing.T) {
	want := map[api.Tier]int{
		api.Background: rankBackground, api.Low: rankLow, api.Normal: rankNormal,
		api.High: rankHigh, api.Critical: rankCritical,
	}
	for tier, r := range want {
		if tier.Rank() != r {
			t.Errorf("%v.Rank() = %d, scheduler ranks it %d", tier, tier.Rank(), r)
		}
	}
	if len(want) != api.NumTiers {
		t.Errorf("%d tiers, api.NumTiers = %d", len(want), api.NumTiers)
	}
}
