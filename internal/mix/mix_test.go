package mix

import "testing"

// TestMix64 pins the SplitMix64 finaliser to reference outputs: the
// first values of splitmix64 seeded with 0 are Mix64 of multiples of the
// golden gamma.
func TestMix64(t *testing.T) {
	const gamma = 0x9e3779b97f4a7c15
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}
	for i, w := range want {
		if got := Mix64(uint64(i+1) * gamma); got != w {
			t.Errorf("Mix64(%d*gamma) = %#x, want %#x", i+1, got, w)
		}
	}
	if Mix64(0) != 0 {
		t.Error("Mix64(0) != 0")
	}
}
