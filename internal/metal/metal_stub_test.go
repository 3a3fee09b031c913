//go:build !mlx

package metal

import (
	"errors"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

func TestUnavailableWithoutMLX(t *testing.T) {
	Init()
	_, err := ReadMemory()
	errs := []error{err, ResetPeakMemory(), ClearCache()}
	for _, f := range []func() (uint64, error){
		MemoryLimit,
		func() (uint64, error) { return SetMemoryLimit(1) },
		func() (uint64, error) { return SetCacheLimit(1) },
		func() (uint64, error) { return SetWiredLimit(1) },
	} {
		_, err := f()
		errs = append(errs, err)
	}
	_, err = DefaultDevice()
	errs = append(errs, err)
	for i, err := range errs {
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("call %d: err = %v, want ErrUnavailable wrapping engine.ErrUnavailable", i, err)
		}
	}
}
