package job

import (
	"errors"
	"strings"
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

// A partition with replicated stages is refused at the spec check, with
// its reason; partitioner names and plain descriptions pass.
func TestSpecRefusesReplicatedPartitions(t *testing.T) {
	for _, tc := range []struct {
		partition string
		ok        bool
	}{
		{"auto", true},
		{"balanced", true},
		{"fc1-fc16@a; fc17-fc32@b", true},
		{"fc1-fc16; fc17-fc32", true},
		{"fc1-fc16@a,b; fc17-fc32@c", false},
		{"fc1-fc16@a:3,b:1; fc17-fc32@c", false},
		{"fc1-fc16@a; fc17-fc32@b , c", false},
	} {
		s := DefaultSpec()
		s.Partition = tc.partition
		err := s.Normalize()
		if tc.ok != (err == nil) || err != nil && (!errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "replicated stages are planned and simulated, not yet run")) {
			t.Errorf("partition %q: %v, want ok=%v", tc.partition, err, tc.ok)
		}
	}
}
