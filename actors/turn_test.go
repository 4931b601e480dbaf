package actors

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/ppnode/ppnode/balance"
)

// The chunks of a node, each on a goroutine of its own, run their
// instructions in the node's order, step after step; a failure releases
// every wait with the error.
func TestTurnRunsTheNodesOrder(t *testing.T) {
	order := []balance.Slot{{Stage: 0, PC: 0}, {Stage: 2, PC: 0}, {Stage: 2, PC: 1}, {Stage: 0, PC: 1}, {Stage: 0, PC: 2}, {Stage: 2, PC: 2}}
	h := &StageHost{}
	a, err := h.acquireTurn("j", 1, order)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.acquireTurn("j", 1, order)
	if err != nil || a != b {
		t.Fatalf("the second stage of a generation: %v, same turn %v", err, a == b)
	}
	if _, err := h.acquireTurn("j", 1, order[:3]); err == nil {
		t.Fatal("a stage with another order was given the turn")
	}
	const steps = 3
	var mu sync.Mutex
	var ran []balance.Slot
	var wg sync.WaitGroup
	for _, stage := range []int{2, 0} {
		wg.Go(func() {
			for range steps {
				for pc := range 3 {
					if err := a.wait(stage, pc); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					ran = append(ran, balance.Slot{Stage: stage, PC: pc})
					mu.Unlock()
					a.done()
				}
			}
		})
	}
	wg.Wait()
	var want []balance.Slot
	for range steps {
		want = append(want, order...)
	}
	if !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
	errBroken := errors.New("link broken")
	done := make(chan error)
	go func() { done <- a.wait(2, 2) }() // not its turn: (0, 0) is next
	a.fail(errBroken)
	if err := <-done; !errors.Is(err, errBroken) {
		t.Fatalf("wait after a failure: %v", err)
	}
	h.releaseTurn(a)
	h.releaseTurn(b)
	if len(h.turns) != 0 {
		t.Fatalf("%d turns left after their stages", len(h.turns))
	}
	if err := checkTurn(order, 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := checkTurn([]balance.Slot{{Stage: 2, PC: 1}, {Stage: 2, PC: 0}}, 2, 2); err == nil {
		t.Fatal("an order that runs a stage's instructions out of order was accepted")
	}
}
