package job

import (
	"errors"
	"testing"
)

func TestSpecBackendNames(t *testing.T) {
	for _, tc := range []struct {
		backend string
		det     bool
		ok      bool
	}{
		{"", true, true},
		{"ppnode-det", true, true},
		{"gonum", true, true}, // the deterministic backend's former name
		{"ppnode-det", false, true},
		{"nosuch", false, false},
		{"nosuch", true, false},
	} {
		s := DefaultSpec()
		s.Backend, s.Deterministic = tc.backend, tc.det
		err := s.Normalize()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrSpec) {
			t.Errorf("backend %q deterministic %v: %v, want ok=%v", tc.backend, tc.det, err, tc.ok)
		}
	}
}
