package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// InmemControl is the in-memory twin of [System], for tests: its nodes are
// stage hosts in this process, and control messages reach their stages
// through a mailbox per stage, handled by the same code as the protoactor
// actors. A node can be killed (its stages stop, their links close, as in a
// process that dies: it refuses pings at once) and cut off (messages to it
// are lost and requests time out, as for a hung node or a cut link). The
// zero value is ready to use; it is safe for concurrent use.
type InmemControl struct {
	mu    sync.Mutex // guards nodes and seq
	nodes map[string]*inmemNode
	seq   int
}

var _ Control = (*InmemControl)(nil)

type inmemNode struct {
	host   *StageHost
	stages map[string]*inmemStage
	gens   map[string]uint64 // newest generation spawned per job
	dead   bool
	cut    bool
}

type inmemStage struct {
	a    *stageActor
	mail chan envelope
	done chan struct{} // closed when the stage has stopped
}

// envelope is a message for a stage and how to answer it.
type envelope struct {
	msg   any
	reply func(proto.Message)
}

// AddNode makes a node hosting stages at addr.
func (c *InmemControl) AddNode(addr string, host *StageHost) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes == nil {
		c.nodes = map[string]*inmemNode{}
	}
	c.nodes[addr] = &inmemNode{host: host, stages: map[string]*inmemStage{}, gens: map[string]uint64{}}
}

// Kill makes the node at addr die: its stages stop and its address refuses
// everything from now on.
func (c *InmemControl) Kill(addr string) {
	c.mu.Lock()
	n := c.nodes[addr]
	var stages []*inmemStage
	if n != nil && !n.dead {
		n.dead = true
		for _, s := range n.stages {
			stages = append(stages, s)
		}
		n.stages = map[string]*inmemStage{}
	}
	c.mu.Unlock()
	for _, s := range stages {
		s.mail <- envelope{msg: killed{}}
		<-s.done
	}
}

// Cut cuts the node at addr off (cut) or reconnects it: while cut off,
// messages to it are lost.
func (c *InmemControl) Cut(addr string, cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[addr]; n != nil {
		n.cut = cut
	}
}

// killed tells a stage that its node died.
type killed struct{}

// errDeadLetter is the answer to a message for a stage that is gone.
var errDeadLetter = errors.New("dead letter")

func (c *InmemControl) Spawn(addr string, req *SpawnStage, timeout time.Duration) (StageRef, error) {
	if err := checkMessage(req, DefaultMaxMessageBytes); err != nil {
		return StageRef{}, err
	}
	c.mu.Lock()
	n := c.nodes[addr]
	switch {
	case n == nil || n.dead:
		c.mu.Unlock()
		return StageRef{}, fmt.Errorf("actors: spawn on %s: connection refused", addr)
	case n.cut:
		c.mu.Unlock()
		t := time.NewTimer(timeout) // the request is lost: the caller waits it out
		<-t.C
		return StageRef{}, fmt.Errorf("actors: spawn on %s: timed out", addr)
	}
	rep := admitSpawn(n.gens, req, req.GetKind() == StageKind, addr)
	if rep.Status == SpawnStatus_SPAWN_STATUS_OK {
		c.seq++
		id := fmt.Sprintf("stage-%d", c.seq)
		s := &inmemStage{a: &stageActor{host: n.host}, mail: make(chan envelope, 64), done: make(chan struct{})}
		ref := StageRef{Addr: addr, ID: id}
		s.a.post = func(m any) {
			select {
			case s.mail <- envelope{msg: m, reply: func(proto.Message) {}}:
			case <-s.done:
			}
		}
		n.stages[id] = s
		go c.serve(ref, s)
		rep.PidAddress, rep.PidId = addr, id
	}
	c.mu.Unlock()
	return spawned(addr, req, rep)
}

// serve handles a stage's mail, one message at a time, until it stops.
func (c *InmemControl) serve(ref StageRef, s *inmemStage) {
	defer close(s.done)
	for e := range s.mail {
		if _, ok := e.msg.(killed); ok {
			s.a.shutdown()
			return
		}
		if s.a.handle(e.msg, e.reply) {
			c.mu.Lock()
			if n := c.nodes[ref.Addr]; n != nil {
				delete(n.stages, ref.ID)
			}
			c.mu.Unlock()
			// As protoactor's poison pill: what was queued is answered.
			for {
				select {
				case e := <-s.mail:
					s.a.handle(e.msg, e.reply)
				default:
					return
				}
			}
		}
	}
}

// stage finds a stage and whether a message to it is lost.
func (c *InmemControl) stage(to StageRef) (*inmemStage, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[to.Addr]
	if n == nil || n.dead {
		return nil, false, fmt.Errorf("actors: %s: connection refused", to)
	}
	if n.cut {
		return nil, true, nil
	}
	s := n.stages[to.ID]
	if s == nil {
		return nil, false, fmt.Errorf("actors: %s: %w", to, errDeadLetter)
	}
	return s, false, nil
}

func (c *InmemControl) Request(to StageRef, msg proto.Message, timeout time.Duration) (proto.Message, error) {
	if err := checkMessage(msg, DefaultMaxMessageBytes); err != nil {
		return nil, err
	}
	s, lost, err := c.stage(to)
	if err != nil {
		return nil, fmt.Errorf("actors: request %s: %w", proto.MessageName(msg), err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	answer := make(chan proto.Message, 1)
	if !lost {
		select {
		case s.mail <- envelope{msg: msg, reply: func(m proto.Message) { answer <- m }}:
		case <-s.done:
			return nil, fmt.Errorf("actors: request %s to %s: %w", proto.MessageName(msg), to, errDeadLetter)
		}
	}
	select {
	case m := <-answer:
		return m, nil
	case <-t.C:
		return nil, fmt.Errorf("actors: request %s to %s: timed out after %v", proto.MessageName(msg), to, timeout)
	}
}

func (c *InmemControl) Send(to StageRef, msg proto.Message) error {
	if err := checkMessage(msg, DefaultMaxMessageBytes); err != nil {
		return err
	}
	s, lost, err := c.stage(to)
	if err != nil || lost {
		return nil // a lost message, as over the network
	}
	select {
	case s.mail <- envelope{msg: msg, reply: func(proto.Message) {}}:
	case <-s.done:
	}
	return nil
}

func (c *InmemControl) Ping(ctx context.Context, addr string, timeout time.Duration) error {
	c.mu.Lock()
	n := c.nodes[addr]
	dead, cut := n == nil || n.dead, n != nil && n.cut
	c.mu.Unlock()
	switch {
	case dead:
		return fmt.Errorf("actors: ping %s: connection refused", addr)
	case cut:
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-t.C:
			return fmt.Errorf("actors: ping %s: timed out", addr)
		case <-ctx.Done():
			return fmt.Errorf("actors: ping %s: %w", addr, ctx.Err())
		}
	}
	return nil
}

// Forget does nothing: the twin keeps no connections.
func (c *InmemControl) Forget(addr string) {}
