package scheduler

// Tier ranks as api.Tier.Rank numbers them, least urgent first; they index
// the scheduler's per-tier tables.
const (
	rankBackground = iota
	rankLow
	rankNormal
	rankHigh
	rankCritical
)
