package balance

import (
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// attached reports whether node i of g goes with the node before it: it
// has no parameters, reads only the output of node i-1, and is that
// output's only reader, which is not the graph output (or node i-1 is the
// first node and carries buffers only, see nn.Carry). ReLU after Linear,
// pooling after ReLU and dropout after ReLU are attached; a layer that
// joins branches or follows a fork is not. A range of layers that ends at
// a node takes the chain of nodes attached after it, and partitioners
// never cut inside such a chain.
func attached(g *nn.Graph, cons map[string][]string, i int) bool {
	if i == 0 {
		return false
	}
	if i == 1 && g.Nodes[0].Layer.Kind() == "carry" {
		return true // the carrier of an imported model's buffers goes with the first layer
	}
	n, prev := g.Nodes[i], g.Nodes[i-1]
	return len(n.Layer.Params()) == 0 && len(n.Inputs) == 1 && n.Inputs[0] == prev.Name &&
		len(cons[prev.Name]) == 1 && prev.Name != g.Output
}

// units cuts g's nodes into the runs [lo, hi) that partitioners keep
// together: a node and the nodes attached after it.
func units(g *nn.Graph) [][2]int {
	cons := g.Consumers()
	var u [][2]int
	for i := range g.Nodes {
		if attached(g, cons, i) {
			u[len(u)-1][1] = i + 1
		} else {
			u = append(u, [2]int{i, i + 1})
		}
	}
	return u
}

// layout is a model prepared for the partitioners: units in topological
// order and what crosses each cut between them.
type layout struct {
	g     *nn.Graph
	prof  *ModelProfile
	units [][2]int
	unit  []int // node index -> unit
	// crossing[e] lists the nodes whose outputs are produced before cut e
	// (between units e-1 and e) and read at or after it.
	crossing [][]int
	// gradCrossing is the subset whose gradient flows back.
	gradCrossing [][]int
	nodePos      map[string]int
}

func newLayout(g *nn.Graph, prof *ModelProfile) *layout {
	l := &layout{g: g, prof: prof, units: units(g), unit: make([]int, len(g.Nodes)), nodePos: map[string]int{}}
	for u, r := range l.units {
		for i := r[0]; i < r[1]; i++ {
			l.unit[i] = u
		}
	}
	for i, n := range g.Nodes {
		l.nodePos[n.Name] = i
	}
	U := len(l.units)
	lastUse := make([]int, len(g.Nodes))
	for i := range lastUse {
		lastUse[i] = -1
	}
	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			if j, ok := l.nodePos[in]; ok {
				lastUse[j] = max(lastUse[j], l.unit[i])
			}
		}
	}
	l.crossing = make([][]int, U+1)
	l.gradCrossing = make([][]int, U+1)
	for j := range g.Nodes {
		for e := l.unit[j] + 1; e <= lastUse[j]; e++ {
			l.crossing[e] = append(l.crossing[e], j)
			if g.Nodes[j].RequiresGrad {
				l.gradCrossing[e] = append(l.gradCrossing[e], j)
			}
		}
	}
	return l
}

// tensorBytes is the size on the wire of node j's output for a
// micro-batch of b samples: a tensorio frame, raw codec.
func (l *layout) tensorBytes(j, b int) float64 {
	n := l.g.Nodes[j]
	return float64(l.prof.Layers[j].OutputBytes)*float64(b) + float64(tensorio.FrameHeaderLen(len(n.Shape)+1))
}

// costs are a layout's per-unit arrays for one micro-batch size, optimizer
// and schedule, in prefix-sum form so that any run of units costs O(1).
type costs struct {
	U int
	// work[e] is the forward+backward time of units [0, e) on the
	// reference node, in seconds; back[e] its backward part.
	work, back []float64
	// static[e] is the memory of units [0, e) that does not depend on the
	// micro-batches in flight: parameters, gradients, optimizer state.
	static []float64
	// train[e] is the trainable-parameter bytes of units [0, e): what a
	// replica's gradient sum carries.
	train []float64
	// buffers[e] is the bytes of units [0, e)'s buffers (running
	// statistics): a stage with some cannot have replicas.
	buffers []float64
	// slot[e] is the memory of units [0, e) per micro-batch in flight.
	slot []float64
	// act[e] and grad[e] are the bytes crossing cut e forward
	// (activations) and backward (gradients) per micro-batch.
	act, grad []float64
}

// costsFor computes the arrays for micro-batches of b samples and an
// optimizer with optSlots state tensors per parameter.
func (l *layout) costsFor(b, optSlots int) *costs {
	U := len(l.units)
	c := &costs{U: U, work: make([]float64, U+1), back: make([]float64, U+1), static: make([]float64, U+1), train: make([]float64, U+1),
		buffers: make([]float64, U+1), slot: make([]float64, U+1), act: make([]float64, U+1), grad: make([]float64, U+1)}
	for u, r := range l.units {
		var w, bw, st, tr, bu, sl float64
		for i := r[0]; i < r[1]; i++ {
			lp := &l.prof.Layers[i]
			w += lp.Forward.At(b) + lp.Backward.At(b)
			bw += lp.Backward.At(b)
			st += float64(lp.ParamBytes) + float64(lp.TrainableBytes)*float64(1+optSlots)
			tr += float64(lp.TrainableBytes)
			for _, prm := range l.g.Nodes[i].Layer.Params() {
				if prm.Running {
					bu += float64(4 * nn.Size(prm.Value.Shape()))
				}
			}
			sl += lp.SlotBytes * float64(b)
		}
		c.work[u+1] = c.work[u] + w
		c.back[u+1] = c.back[u] + bw
		c.static[u+1] = c.static[u] + st
		c.train[u+1] = c.train[u] + tr
		c.buffers[u+1] = c.buffers[u] + bu
		c.slot[u+1] = c.slot[u] + sl
	}
	// A pipeline's first stage keeps the data of each micro-batch in
	// flight (it comes from the coordinator, so no link carries it).
	for k := range l.g.InputNames {
		c.act[0] += float64(4 * nn.Size(l.g.InputShapes[k]) * b)
	}
	for e := 0; e <= U; e++ {
		for _, j := range l.crossing[e] {
			c.act[e] += l.tensorBytes(j, b)
		}
		for _, j := range l.gradCrossing[e] {
			c.grad[e] += l.tensorBytes(j, b)
		}
	}
	return c
}

// unitNames returns the node names of units [i, e).
func (l *layout) unitNames(i, e int) []string {
	var out []string
	for u := i; u < e; u++ {
		for k := l.units[u][0]; k < l.units[u][1]; k++ {
			out = append(out, l.g.Nodes[k].Name)
		}
	}
	return out
}
