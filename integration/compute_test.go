package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The binary the nodes run computes with what the machine has installed,
// and with oneDNN it starts with its OpenMP threads' spin bounded
// (cmd/ppnode/openmp.go), unless the user chose one.
func TestBinaryComputes(t *testing.T) {
	version := func(extra ...string) (compute, spin string) {
		cmd := exec.Command(Binary(t), "version", "--json")
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "GOMP_SPINCOUNT=") && !strings.HasPrefix(kv, "OMP_WAIT_POLICY=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, extra...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("ppnode version --json: %v", err)
		}
		var v struct {
			Compute string `json:"compute"`
			Spin    string `json:"openmp_spin"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("ppnode version --json: %v: %s", err, out)
		}
		return v.Compute, v.Spin
	}
	compute, spin := version()
	if !HaveOneDNN() {
		if strings.Contains(compute, "onednn") || spin != "" {
			t.Errorf("built without oneDNN: computes with %q, GOMP_SPINCOUNT %q", compute, spin)
		}
		return
	}
	if !strings.HasSuffix(compute, "+onednn") || spin != "30000" {
		t.Errorf("computes with %q, GOMP_SPINCOUNT %q; want +onednn and 30000", compute, spin)
	}
	if _, spin := version("GOMP_SPINCOUNT=1000"); spin != "1000" {
		t.Errorf("the user's GOMP_SPINCOUNT=1000 became %q", spin)
	}
	if _, spin := version("OMP_WAIT_POLICY=passive"); spin != "" {
		t.Errorf("with the user's OMP_WAIT_POLICY, GOMP_SPINCOUNT %q was set", spin)
	}
}
