package nodes

import (
	"strings"
	"testing"
	"time"
)

// A node's own name follows the rule of the job records and plans (CheckName), or
// Start refuses it before anything starts: every holder would refuse the
// records naming it, and its jobs would have no replicas.
func TestStartChecksTheName(t *testing.T) {
	for _, name := range []string{"", "a\nb", "tab\there", strings.Repeat("n", 5000), "bad\xffutf8", "a b", "x@y", "c;d"} {
		if checkName("coordinator", name) == nil {
			t.Errorf("the record rule accepts %q", name)
		}
		a, err := Start(Config{Name: name, Bind: "127.0.0.1:0", HTTP: "127.0.0.1:0", Threads: 1, ProfileFor: time.Millisecond,
			Logger: testLogger(t)})
		if err == nil {
			a.Close()
			t.Errorf("Start accepted the name %q", name)
			continue
		}
		if !strings.Contains(err.Error(), "want 1 to 256 bytes of UTF-8 without control characters") || len(err.Error()) > 200 {
			t.Errorf("name %.20q: %v; want the rule, briefly", name, err)
		}
	}
	for _, name := range []string{"a", "node-1.example.org", strings.Repeat("é", 128)} {
		if err := CheckName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
}
