package tokenbucket_test

import (
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/internal/tokenbucket"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestTake: a bucket starts full, spends a burst, then says how long
// until the next unit, refills at its rate and never above its size.
func TestTake(t *testing.T) {
	b := tokenbucket.New(2, 3) // 2 per second, size 3
	for i := range 3 {
		if wait := b.Take(t0, 1); wait != 0 {
			t.Fatalf("take %d of the burst: wait %v", i, wait)
		}
	}
	if wait := b.Take(t0, 1); wait != 500*time.Millisecond {
		t.Fatalf("empty: wait %v, want 500ms", wait)
	}
	if wait := b.Take(t0.Add(250*time.Millisecond), 1); wait != 250*time.Millisecond {
		t.Fatalf("half refilled: wait %v, want 250ms (a refusal spends nothing)", wait)
	}
	if wait := b.Take(t0.Add(500*time.Millisecond), 1); wait != 0 {
		t.Fatalf("refilled: wait %v", wait)
	}
	later := t0.Add(time.Hour) // refills to the size, not beyond
	if wait := b.Take(later, 3); wait != 0 {
		t.Fatalf("after an hour, 3: wait %v", wait)
	}
	if wait := b.Take(later, 1); wait != 500*time.Millisecond {
		t.Fatalf("after an hour, a fourth: wait %v, want 500ms", wait)
	}
}

// TestChargeDebt: Charge spends past empty, and the debt is waited off
// at the rate before the bucket holds anything again.
func TestChargeDebt(t *testing.T) {
	b := tokenbucket.New(10, 60) // a minute's allowance of 600 per minute
	if wait := b.Until(t0, 0); wait != 0 {
		t.Fatalf("full: wait %v", wait)
	}
	b.Charge(t0, 160) // 100 in debt: more than the size at once
	wait := b.Until(t0, 0)
	if wait != 10*time.Second {
		t.Fatalf("100 in debt at 10/s: wait %v, want 10s", wait)
	}
	if wait := b.Until(t0.Add(10*time.Second), 0); wait <= 0 {
		t.Fatal("at 10s the bucket holds nothing yet, but no wait")
	}
	if wait := b.Until(t0.Add(10*time.Second+time.Millisecond), 0); wait != 0 {
		t.Fatalf("debt paid: wait %v", wait)
	}
}

// TestClockBack: a clock that goes back adds nothing, and the time it
// went back is not counted twice.
func TestClockBack(t *testing.T) {
	b := tokenbucket.New(1, 1)
	b.Take(t0, 1)
	if wait := b.Take(t0.Add(-time.Hour), 1); wait != time.Second {
		t.Fatalf("clock back: wait %v, want 1s", wait)
	}
	if wait := b.Take(t0.Add(time.Second/2), 1); wait != time.Second/2 {
		t.Fatalf("half a second after the first take: wait %v, want 500ms", wait)
	}
}

// TestNil: a nil bucket is no limit.
func TestNil(t *testing.T) {
	var b *tokenbucket.Bucket
	b.Charge(t0, 1e9)
	if b.Take(t0, 1e9) != 0 || b.Until(t0, 1e9) != 0 {
		t.Fatal("a nil bucket refused")
	}
}
