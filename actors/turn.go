package actors

import (
	"fmt"
	"slices"
	"sync"

	"github.com/ppnode/ppnode/balance"
)

// turn is the executor of a node that holds several stages of one plan
// (the chunks of an interleaved plan): each chunk is a stage actor of its
// own, with its own engine, slots and links, and they share the node's
// turn, which lets a chunk run an instruction only when it is the next one
// in the node's order (balance.Plan.NodeOrder). The node then runs its
// chunks' passes one at a time and in the schedule's order, as the
// simulator replays them, rather than as the operating system would
// schedule v goroutines on its cores. The order wraps around at its end:
// every chunk runs its whole program once per step.
//
// A failure of any chunk's step fails the turn for good: the other chunks'
// waits return the error, so a node whose chunk fails stops as one
// executor, and its plan generation, whose stages own the turn, is done.
// Safe for concurrent use.
type turn struct {
	key   turnKey
	order []balance.Slot

	mu    sync.Mutex // guards pos, err and users
	cond  *sync.Cond
	pos   int   // the next slot of order to run
	err   error // the first failure
	users int   // the stages set up with the turn
}

// turnKey names a turn on its node: the stages of one job's generation.
type turnKey struct {
	job string
	gen uint64
}

// wait returns once instruction pc of stage is the node's next, or the
// turn's failure.
func (t *turn) wait(stage, pc int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.err == nil && t.order[t.pos] != (balance.Slot{Stage: stage, PC: pc}) {
		t.cond.Wait()
	}
	return t.err
}

// done passes the turn on from the instruction that had it.
func (t *turn) done() {
	t.mu.Lock()
	t.pos = (t.pos + 1) % len(t.order)
	t.mu.Unlock()
	t.cond.Broadcast()
}

// fail makes every wait return err (the first failure wins).
func (t *turn) fail(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = fmt.Errorf("another stage of this node failed: %w", err)
	}
	t.mu.Unlock()
	t.cond.Broadcast()
}

// checkTurn checks that order runs every instruction of stage's program,
// in the program's order, once.
func checkTurn(order []balance.Slot, stage, n int) error {
	next := 0
	for _, sl := range order {
		if sl.Stage != stage {
			continue
		}
		if sl.PC != next {
			return fmt.Errorf("the node's order runs instruction %d of stage %d where %d is next", sl.PC, stage, next)
		}
		next++
	}
	if next != n {
		return fmt.Errorf("the node's order runs %d of stage %d's %d instructions", next, stage, n)
	}
	return nil
}

// acquireTurn returns the node's turn for the stages of job's generation,
// made with order by the first of them; a later stage must bring the same
// order.
func (h *StageHost) acquireTurn(job string, gen uint64, order []balance.Slot) (*turn, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := turnKey{job, gen}
	t := h.turns[k]
	if t == nil {
		if h.turns == nil {
			h.turns = map[turnKey]*turn{}
		}
		t = &turn{key: k, order: slices.Clone(order)}
		t.cond = sync.NewCond(&t.mu)
		h.turns[k] = t
	} else if !slices.Equal(t.order, order) {
		return nil, fmt.Errorf("the node's order differs from the one its other stages of generation %d were given", gen)
	}
	t.mu.Lock()
	t.users++
	t.mu.Unlock()
	return t, nil
}

// releaseTurn drops a stage's use of t; the last frees it.
func (h *StageHost) releaseTurn(t *turn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t.mu.Lock()
	t.users--
	last := t.users == 0
	t.mu.Unlock()
	if last && h.turns[t.key] == t {
		delete(h.turns, t.key)
	}
}
