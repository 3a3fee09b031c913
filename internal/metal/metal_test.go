//go:build mlx

package metal

import (
	"testing"
)

func TestMemoryControls(t *testing.T) {
	if _, err := ReadMemory(); err != nil {
		t.Fatal(err)
	}
	dev, err := DefaultDevice()
	if err != nil {
		t.Fatal(err)
	}
	prev, err := SetCacheLimit(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	back, err := SetCacheLimit(prev)
	if err != nil {
		t.Fatal(err)
	}
	// MLX's CPU-only build keeps no buffer cache and reports 0.
	if dev.Type == "gpu" && back != 1<<20 {
		t.Fatalf("SetCacheLimit returned %d; want the 1 MiB set before", back)
	}
	lim, err := MemoryLimit()
	if err != nil || lim == 0 {
		t.Fatalf("MemoryLimit = %d, %v", lim, err)
	}
	old, err := SetMemoryLimit(lim / 2)
	if err != nil || old != lim {
		t.Fatalf("SetMemoryLimit returned %d, %v; want %d", old, err, lim)
	}
	if now, _ := MemoryLimit(); now != lim/2 {
		t.Fatalf("MemoryLimit after set = %d, want %d", now, lim/2)
	}
	if _, err := SetMemoryLimit(lim); err != nil {
		t.Fatal(err)
	}
	if _, err := SetWiredLimit(0); err != nil {
		t.Fatal(err)
	}
	if err := ResetPeakMemory(); err != nil {
		t.Fatal(err)
	}
	if err := ClearCache(); err != nil {
		t.Fatal(err)
	}
	m, err := ReadMemory()
	if err != nil || m.Cache != 0 || m.Peak < m.Active {
		t.Fatalf("after ClearCache and ResetPeakMemory: %+v, %v", m, err)
	}
}

func TestDefaultDevice(t *testing.T) {
	d, err := DefaultDevice()
	if err != nil {
		t.Fatal(err)
	}
	if d.Type != "cpu" && d.Type != "gpu" {
		t.Fatalf("device type %q", d.Type)
	}
	t.Logf("default device: %+v", d)
}
