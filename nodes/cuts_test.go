package nodes

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/ppnode/ppnode/tensorio"
)

// A forgotten run's cuts leave the store; another run's, or a run the
// node does not know, stay.
func TestCutsDropOnlyTheirRun(t *testing.T) {
	st, err := tensorio.OpenStore(t.TempDir(), CheckpointsKept)
	if err != nil {
		t.Fatal(err)
	}
	cs := newCuts(st, slog.New(slog.DiscardHandler))
	put := func(id string) string {
		dir := filepath.Join(st.Dir(), id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "marker"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	if err := cs.claim("job-1", "run-2"); err != nil {
		t.Fatal(err)
	}
	dir := put("job-1")
	unknown := put("job-9") // written before this node started
	cs.drop("job-1", "run-1")
	cs.drop("job-9", "run-9")
	for _, d := range []string{dir, unknown} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s after dropping another run: %v", d, err)
		}
	}
	cs.drop("job-1", "run-2")
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the forgotten run's cuts: %v, want them gone", err)
	}
	if r := cs.run("job-1"); r != "" {
		t.Errorf("the store's run of the forgotten job is %q", r)
	}
}
