package nn

import (
	"strings"
	"testing"
)

func tiedParam(name string, grad ...float32) *Param {
	return &Param{Name: name, Value: New(len(grad)), Grad: FromData(grad, len(grad))}
}

// Copies of one tensor get the sum of their gradients, added in the
// group's order whether the copies are here or stand in from elsewhere;
// files, hashes and counts see the tensor once.
func TestTies(t *testing.T) {
	// In float32 1e8 + 1 - 1e8 is 0 and 1e8 - 1e8 + 1 is 1: the order shows.
	a, b, c := tiedParam("w", 1e8), tiedParam("w", 1), tiedParam("w", -1e8)
	other, buf := tiedParam("v", 5), &Param{Name: "w", Value: New(1)}
	ps := []*Param{a, other, b, buf, c}
	groups := Ties(ps)
	if len(groups) != 1 || len(groups[0]) != 3 || groups[0][0] != a || groups[0][1] != b || groups[0][2] != c {
		t.Fatalf("Ties = %v", groups)
	}
	SumTies(groups[0], nil)
	for _, p := range groups[0] {
		if F32(p.Grad)[0] != 0 {
			t.Fatalf("sum %v, want (1e8 + 1) - 1e8 = 0 in float32", F32(p.Grad)[0])
		}
	}
	if u := Unique(ps); len(u) != 3 || u[0] != a || u[1] != other || u[2] != buf {
		t.Fatalf("Unique = %v", u)
	}
	// b here, a and c elsewhere: the same additions, into b alone.
	a, b, c = tiedParam("w", 1e8), tiedParam("w", 1), tiedParam("w", -1e8)
	SumTies([]*Param{a, b, c}, []*Tensor{a.Grad, nil, c.Grad})
	if F32(b.Grad)[0] != 0 || F32(a.Grad)[0] != 1e8 || F32(c.Grad)[0] != -1e8 {
		t.Fatalf("remote copies: b %v, a %v, c %v", F32(b.Grad), F32(a.Grad), F32(c.Grad))
	}
	if err := CheckTies([]*Param{tiedParam("w", 1, 2), tiedParam("w", 1)}); err == nil || !strings.Contains(err.Error(), "differ") {
		t.Fatalf("copies of two shapes: %v", err)
	}
	b1, b2 := &Param{Name: "bn.running_mean", Value: New(2)}, &Param{Name: "bn.running_mean", Value: New(2)}
	if err := CheckTies([]*Param{b1, b2}); err == nil || !strings.Contains(err.Error(), "buffer") {
		t.Fatalf("a buffer in two layers: %v", err)
	}
	l1, l2 := tiedParam("w", 1, 2, 3, 4), tiedParam("w", 1, 2, 3, 4)
	l1.Value, l2.Value, l2.Layout = New(2, 2), New(2, 2), []int{1, 0}
	if err := CheckTies([]*Param{l1, l2}); err == nil {
		t.Fatal("copies of two layouts accepted")
	}
}
