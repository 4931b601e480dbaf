package nn

import (
	"runtime"
	"sync"
)

// teamCall is a stage pass run on the team thread.
type teamCall struct {
	s        *Stage
	c        Ctx
	slot     int
	in       []*Tensor
	pass     func(s *Stage, c *Ctx, slot int, in []*Tensor) []*Tensor
	out      []*Tensor
	panicked any
	done     chan struct{}
}

var (
	teamOnce  sync.Once
	teamQueue chan *teamCall
	teamCalls = sync.Pool{New: func() any { return &teamCall{done: make(chan struct{}, 1)} }}
)

// onTeam runs a stage pass on the one OS thread that makes every oneDNN
// call, so that OpenMP keeps one team of threads.
func onTeam(s *Stage, c *Ctx, slot int, in []*Tensor, pass func(s *Stage, c *Ctx, slot int, in []*Tensor) []*Tensor) []*Tensor {
	teamOnce.Do(func() {
		teamQueue = make(chan *teamCall)
		go func() {
			runtime.LockOSThread()
			for t := range teamQueue {
				t.run()
			}
		}()
	})
	t := teamCalls.Get().(*teamCall)
	t.s, t.c, t.slot, t.in, t.pass = s, *c, slot, in, pass
	t.c.team = true
	teamQueue <- t
	<-t.done
	out, p := t.out, t.panicked
	*t = teamCall{done: t.done}
	teamCalls.Put(t)
	if p != nil {
		panic(p)
	}
	return out
}

func (t *teamCall) run() {
	defer func() {
		t.panicked = recover()
		t.done <- struct{}{}
	}()
	t.out = t.pass(t.s, &t.c, t.slot, t.in)
}
