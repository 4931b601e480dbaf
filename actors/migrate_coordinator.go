package actors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
)

// stateMove is how a plan change moves the state of the job's layers.
type stateMove struct {
	sources   [][]StateSource          // per stage of the new plan
	transfers map[int][]*StateTransfer // per stage of the old plan
	// stateBytes is the state (parameters and optimizer) of the layers
	// that change node, localBytes that of the layers that stay on theirs.
	stateBytes, localBytes int64
}

// planMove maps every layer with state in plan to to its owner in plan
// from, grouped per pair of stages.
func (c *Coordinator) planMove(from, to *balance.Plan) (*stateMove, error) {
	owner := map[string]int{}
	for k, sp := range from.Stages {
		for _, l := range sp.Layers {
			owner[l] = k
		}
	}
	mv := &stateMove{sources: make([][]StateSource, len(to.Stages)), transfers: map[int][]*StateTransfer{}}
	for j, sp := range to.Stages {
		idx := map[int]int{} // old stage -> index in sources[j]
		for _, l := range sp.Layers {
			n := c.job.Graph.Node(l)
			if n == nil {
				return nil, fmt.Errorf("the new plan has a layer %q the model does not", l)
			}
			ps := n.Layer.Params()
			if len(ps) == 0 {
				continue
			}
			k, ok := owner[l]
			if !ok {
				return nil, fmt.Errorf("layer %q is on no stage of the current plan", l)
			}
			i, ok := idx[k]
			if !ok {
				i = len(mv.sources[j])
				idx[k] = i
				mv.sources[j] = append(mv.sources[j], StateSource{From: k, Local: from.Stages[k].Node == sp.Node})
			}
			mv.sources[j][i].Layers = append(mv.sources[j][i].Layers, l)
			var b int64
			for _, t := range stateTensors(ps, c.copt, true) {
				b += dataBytes(t)
			}
			if mv.sources[j][i].Local {
				mv.localBytes += b
			} else {
				mv.stateBytes += b
			}
		}
		for _, s := range mv.sources[j] {
			mv.transfers[s.From] = append(mv.transfers[s.From], &StateTransfer{From: int32(s.From), To: int32(j), Layers: s.Layers})
		}
	}
	return mv, nil
}

// migration is what a direct move did.
type migration struct {
	stateBytes, localBytes int64 // as planned (see stateMove)
	moved, wire            int64 // tensor data sent over links, and with framing
	links                  []job.MovedLink
	// phases: starting the new stages, moving the state, stopping the
	// old stages (milliseconds).
	phases map[string]float64
}

// migrate moves the job, drained after step g, to the plan res made for
// cl, as mv (planMove from the current plan to res's) says: the new plan's stages start next to the old ones (a new generation),
// each gets its layers' state straight from their old owners (see
// migrate.go), then the old stages stop. The coordinator's latest cut is
// not touched. An error is an errRecover: the old stages are gone and the
// job recovers from its latest cut.
func (c *Coordinator) migrate(ctx context.Context, g int, mv *stateMove, res *balance.Result, cl *balance.Cluster) (migration, error) {
	t0 := time.Now()
	oldPlan, oldPids, oldLinks := c.plan, c.pids, c.links
	c.pids, c.links = nil, nil
	c.gen++
	fail := func(err error) (migration, error) {
		c.dropStages(oldPids, oldLinks)
		return migration{}, errRecover{err}
	}
	if err := c.adopt(res, cl); err != nil {
		return fail(err)
	}
	// A node of either plan that dies now fails the move at once.
	c.mu.Lock()
	for _, sp := range oldPlan.Stages {
		c.inPlan[sp.Node] = true
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.inPlan = map[string]bool{}
		for _, sp := range c.plan.Stages {
			c.inPlan[sp.Node] = true
		}
		c.mu.Unlock()
	}()
	listen, err := c.startStages(mv.sources)
	if err != nil {
		return fail(err)
	}
	for j, las := range listen {
		for _, la := range las {
			k := int(la.GetFrom())
			i := -1
			for n, tr := range mv.transfers[k] {
				if int(tr.GetTo()) == j {
					i = n
				}
			}
			if i < 0 || int(la.GetTo()) != j || mv.transfers[k][i].GetAddr() != "" {
				return fail(fmt.Errorf("stage %d listens for state from stage %d, which sends it none", j, k))
			}
			mv.transfers[k][i].Addr = la.GetAddr()
		}
	}
	for k, trs := range mv.transfers {
		for _, tr := range trs {
			if tr.GetAddr() == "" && oldPlan.Stages[k].Node != c.plan.Stages[tr.GetTo()].Node {
				return fail(fmt.Errorf("stage %d does not listen for the state of stage %d", tr.GetTo(), k))
			}
		}
	}
	if c.onMove != nil {
		c.onMove()
	}
	t1 := time.Now()

	// Every new stage receives while every old one sends.
	timeout := c.cfg.Timeout
	ms := (timeout * 9 / 10).Milliseconds() // the stages give up first, and say why
	var fs []*actor.Future
	var who []string
	for j, pid := range c.pids {
		fs = append(fs, c.cfg.System.Actor.Root.RequestFuture(pid, &ReceiveState{Header: c.header(), Steps: int64(g), TimeoutMs: ms}, timeout))
		who = append(who, fmt.Sprintf("new stage %d on %s", j, c.plan.Stages[j].Node))
	}
	nNew := len(fs)
	for k, pid := range oldPids {
		if len(mv.transfers[k]) == 0 {
			continue
		}
		msg := &SendState{Header: c.header(), Transfers: mv.transfers[k], TimeoutMs: ms}
		if err := c.cfg.System.check(msg); err != nil {
			return fail(err)
		}
		fs = append(fs, c.cfg.System.Actor.Root.RequestFuture(pid, msg, timeout))
		who = append(who, fmt.Sprintf("old stage %d on %s", k, oldPlan.Stages[k].Node))
	}
	var links []dataplane.Link
	for _, m := range []map[int]dataplane.Link{oldLinks, c.links} {
		for _, lk := range m {
			links = append(links, lk)
		}
	}
	replies, err := c.awaitMove(ctx, fs, who, links)
	if err != nil {
		return fail(err)
	}

	// The receivers' counts must match the senders'.
	type pair struct{ from, to int32 }
	got := map[pair]*TransferStats{}
	for _, r := range replies[:nNew] {
		for _, st := range r.GetTransfers() {
			got[pair{st.GetFrom(), st.GetTo()}] = st
		}
	}
	var m migration
	m.stateBytes, m.localBytes = mv.stateBytes, mv.localBytes
	for _, r := range replies[nNew:] {
		for _, st := range r.GetTransfers() {
			rc := got[pair{st.GetFrom(), st.GetTo()}]
			if rc == nil || rc.GetTensors() != st.GetTensors() || rc.GetBytes() != st.GetBytes() || rc.GetLocal() != st.GetLocal() {
				return fail(fmt.Errorf("stage %d sent %d tensors (%d bytes) to stage %d, which reports %v", st.GetFrom(), st.GetTensors(), st.GetBytes(), st.GetTo(), rc))
			}
			delete(got, pair{st.GetFrom(), st.GetTo()})
			from, to := int(st.GetFrom()), int(st.GetTo())
			var layers []string
			for _, tr := range mv.transfers[from] {
				if int(tr.GetTo()) == to {
					layers = tr.GetLayers()
				}
			}
			ml := job.MovedLink{FromStage: from, ToStage: to, From: oldPlan.Stages[from].Node, To: c.plan.Stages[to].Node,
				Local: st.GetLocal(), Tensors: st.GetTensors(), Bytes: st.GetBytes(), WireBytes: st.GetWireBytes()}
			if len(layers) > 0 {
				ml.Layers = layerRange(layers)
			}
			m.links = append(m.links, ml)
			if !ml.Local {
				m.moved += ml.Bytes
				m.wire += ml.WireBytes
			}
		}
	}
	if len(got) > 0 {
		return fail(fmt.Errorf("%d transfers were received but not sent", len(got)))
	}
	t2 := time.Now()
	c.stopStages(oldPids, oldLinks)
	m.phases = map[string]float64{"start": msSince(t0, t1), "transfer": msSince(t1, t2), "stop": msSince(t2, time.Now())}
	return m, nil
}

// awaitMove waits for the replies to a move's requests (who names each).
// It fails at the first error, when a node of either plan is reported
// dead, or when a coordinator link to a stage of either plan breaks (its
// stage or node is gone).
func (c *Coordinator) awaitMove(ctx context.Context, fs []*actor.Future, who []string, links []dataplane.Link) ([]*StateMoved, error) {
	type result struct {
		i   int
		r   any
		err error
	}
	ch := make(chan result, len(fs))
	for i, f := range fs {
		go func() {
			r, err := f.Result()
			ch <- result{i, r, err}
		}()
	}
	stop := make(chan struct{})
	defer close(stop)
	broken := make(chan error, len(links))
	for _, lk := range links {
		go func() {
			select {
			case <-lk.Done():
				broken <- lk.Err()
			case <-stop:
			}
		}()
	}
	out := make([]*StateMoved, len(fs))
	for range fs {
		var r result
		select {
		case r = <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case name := <-c.failed:
			return nil, fmt.Errorf("moving state: node %s failed", name)
		case err := <-broken:
			return nil, fmt.Errorf("moving state: a stage's link to the coordinator broke: %w", err)
		}
		if r.err != nil {
			return nil, fmt.Errorf("moving state: %s: %w", who[r.i], r.err)
		}
		switch m := r.r.(type) {
		case *StateMoved:
			if m.GetError() != "" {
				return nil, fmt.Errorf("moving state: %s: %s", who[r.i], m.GetError())
			}
			out[r.i] = m
		case *StepDone:
			return nil, fmt.Errorf("moving state: %s: %s", who[r.i], m.GetError())
		case *Ack:
			return nil, fmt.Errorf("moving state: %s: %s", who[r.i], m.GetError())
		default:
			return nil, fmt.Errorf("moving state: %s: unexpected reply %T", who[r.i], r.r)
		}
	}
	return out, nil
}

// stopStages stops stages and waits (bounded) until each has, then closes
// the coordinator's links to them (a stage whose coordinator link closes
// stops by itself, and would not answer).
func (c *Coordinator) stopStages(pids []*actor.PID, links map[int]dataplane.Link) {
	var wg sync.WaitGroup
	for _, pid := range pids {
		if pid == nil {
			continue
		}
		wg.Go(func() {
			if _, err := c.request(pid, &StopStage{Header: c.header()}, 10*time.Second); err != nil {
				c.log.Warn("stopping a stage of the previous plan", "pid", pid.String(), "err", err)
			}
		})
	}
	wg.Wait()
	for _, lk := range links {
		lk.Close()
	}
}

// stateBytes is the size of the coordinator's model's state: parameters,
// buffers and optimizer state.
func (c *Coordinator) stateBytes() int64 {
	var b int64
	for _, t := range stateTensors(c.job.Graph.Params(), c.copt, true) {
		b += dataBytes(t)
	}
	return b
}

// msSince is the milliseconds from t0 to t1.
func msSince(t0, t1 time.Time) float64 { return float64(t1.Sub(t0).Microseconds()) / 1e3 }
