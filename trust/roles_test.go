package trust

import "testing"

// The role policy as SECURITY.md's table states it; a role that is
// neither (a certificate without one) may do nothing.
func TestMay(t *testing.T) {
	for _, tc := range []struct {
		a                   Action
		node, client, other bool
	}{
		{ActRead, true, true, false},
		{ActUse, true, true, false},
		{ActMember, true, false, false},
		{ActStages, true, false, false},
		{Action(99), false, false, false},
	} {
		for role, want := range map[string]bool{RoleNode: tc.node, RoleClient: tc.client, "": tc.other, "admin": tc.other} {
			if got := May(role, tc.a); got != want {
				t.Errorf("May(%q, %v) = %v, want %v", role, tc.a, got, want)
			}
		}
	}
	if _, err := Authorize(nil, ActStages); err == nil {
		t.Error("Authorize without a TLS session: no error")
	}
}
