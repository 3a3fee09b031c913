package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
)

// parsePrewarm reads -prewarm: comma-separated id=dir[:priority] entries.
func parsePrewarm(list string) ([]prewarm.Model, error) {
	var out []prewarm.Model
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, dir, ok := strings.Cut(item, "=")
		if !ok || id == "" || dir == "" {
			return nil, fmt.Errorf("-prewarm %q: want id=dir[:priority]", item)
		}
		m := prewarm.Model{Spec: engine.ModelSpec{ID: id, Path: dir}}
		if i := strings.LastIndexByte(dir, ':'); i >= 0 {
			p, err := strconv.Atoi(dir[i+1:])
			if err != nil || p >= mainPriority {
				return nil, fmt.Errorf("-prewarm %q: priority %q is not an integer below %d", item, dir[i+1:], mainPriority)
			}
			m.Spec.Path, m.Priority = dir[:i], p
		}
		out = append(out, m)
	}
	return out, nil
}

// parseBytes reads a size: plain bytes, or with a kB, MB, GB, TB (powers of
// 1000) or KiB, MiB, GiB, TiB (powers of 1024) suffix. "" is 0.
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v*mult > 1<<62 {
		return 0, fmt.Errorf("%q is not a size such as 8GiB or 500000000", s)
	}
	return int64(v * mult), nil
}

// parseGPUs reads -gpus: comma-separated device ids ("" : none given).
func parseGPUs(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var ids []int
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || id < 0 {
			return nil, fmt.Errorf("-gpus %q: want device ids like 0,1,2,3", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
