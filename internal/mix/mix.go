// Package mix holds the module's one integer hash finaliser, so the
// prefix indexes and the simulated engine scramble bits the same way.
package mix

// Mix64 is the SplitMix64 finaliser (Steele, Lea and Flood, "Fast
// splittable pseudorandom number generators", 2014): a cheap bijective
// scramble of x whose every output bit depends on every input bit.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
