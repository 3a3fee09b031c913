package enginetest

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// checkAdapterWarm applies to models that implement engine.AdapterWarmer:
// on a model of one slot, WarmAdapter makes an adapter resident without a
// sequence (a sequence of the base open across it), after which the
// adapter decodes what it decodes elsewhere; it refuses an adapter not
// served (ErrModelNotFound) and one whose slot another adapter's open
// sequence holds (ErrOutOfMemory), and honours a cancelled context.
func checkAdapterWarm(tb testing.TB, s *adapterSuite) {
	if _, ok := s.am.(engine.AdapterWarmer); !ok {
		tb.Skip("the model does not implement engine.AdapterWarmer")
	}
	one, err := s.eng.Load(s.ctx, engine.ModelSpec{ID: "conformance-warm", Path: s.dir, AdapterSlots: 1})
	if err != nil {
		tb.Fatalf("Load with one adapter slot: %v", err)
	}
	defer one.Close()
	oam, w := one.(engine.AdapterModel), one.(engine.AdapterWarmer)
	a, b := s.names[0], s.names[1]
	for i, name := range []string{a, b} {
		if _, err := oam.AddAdapter(s.ctx, engine.AdapterSpec{Name: name, Path: s.cases[i].Dir}); err != nil {
			tb.Fatalf("AddAdapter: %v", err)
		}
	}
	if err := w.WarmAdapter(s.ctx, "conformance-not-served"); !errors.Is(err, engine.ErrModelNotFound) {
		tb.Errorf("WarmAdapter of an adapter not served: %v; want ErrModelNotFound", err)
	}
	p := s.prompt(360, 10)
	want := s.aloneWith(tb, s.m, p, 6, a)
	base := s.id()
	if _, err := one.Open(s.ctx, base, p, ""); err != nil {
		tb.Fatalf("Open: %v", err)
	}
	if err := w.WarmAdapter(s.ctx, a); err != nil {
		tb.Errorf("WarmAdapter(%q) beside a sequence of the base: %v", a, err)
	}
	one.Free(base, "")
	if got := s.aloneWith(tb, one, p, 6, a); !slices.Equal(got, want) {
		tb.Errorf("adapter %q once warmed: %v; want %v", a, got, want)
	}
	held := s.id()
	if _, err := oam.OpenAdapter(s.ctx, held, p, "", b); err != nil {
		tb.Fatalf("OpenAdapter(%q): %v", b, err)
	}
	if err := w.WarmAdapter(s.ctx, a); !errors.Is(err, engine.ErrOutOfMemory) {
		tb.Errorf("WarmAdapter(%q) while the one slot is in use: %v; want ErrOutOfMemory", a, err)
	}
	one.Free(held, "")
	ctx, cancel := context.WithCancel(s.ctx)
	cancel()
	if err := w.WarmAdapter(ctx, a); !errors.Is(err, context.Canceled) {
		tb.Errorf("WarmAdapter with a cancelled context: %v; want context.Canceled", err)
	}
}
