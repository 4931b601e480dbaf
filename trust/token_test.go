package trust

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Nodes starting at once share one token, made 0600; a token others may
// read is refused.
func TestLocalToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "http-token")
	toks := make([]string, 8)
	var wg sync.WaitGroup
	for i := range toks {
		wg.Go(func() {
			tok, err := LocalToken(path)
			if err != nil {
				t.Error(err)
			}
			toks[i] = tok
		})
	}
	wg.Wait()
	for _, tok := range toks[1:] {
		if tok != toks[0] || len(tok) != 2*TokenBytes {
			t.Fatalf("tokens %q: want one of %d hex digits", toks, 2*TokenBytes)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, %v: want mode 0600", fi.Mode(), err)
	}
	if !TokenMatches(toks[0], toks[0]) || TokenMatches(toks[0][1:], toks[0]) || TokenMatches("", "") {
		t.Fatal("TokenMatches")
	}
	os.Chmod(path, 0o644)
	if _, err := ReadToken(path); err == nil {
		t.Fatal("a token group and others may read was accepted")
	}
}
