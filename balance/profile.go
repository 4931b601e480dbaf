package balance

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/ppnode/ppnode/nn"
)

// Timing is the time of one pass of a layer over a micro-batch of b
// samples on the reference node: Fixed + PerSample·b seconds. A profile
// measured at one micro-batch size has Fixed = 0; one measured at two
// sizes fits both terms, so that the planner sees that small micro-batches
// cost more per sample.
type Timing struct {
	Fixed     float64 `json:"fixed_s"`
	PerSample float64 `json:"per_sample_s"`
}

// At returns the time for a micro-batch of b samples.
func (t Timing) At(b int) float64 { return t.Fixed + t.PerSample*float64(b) }

// LayerProfile is what the planner knows of one layer (one graph node).
type LayerProfile struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Forward and Backward are the times of the layer's passes on the
	// reference node. Backward is zero when nn skips it (no parameter at or
	// before the layer).
	Forward  Timing `json:"forward"`
	Backward Timing `json:"backward"`
	// Update is the time of one optimizer step (SGD with momentum) over the
	// layer's parameters, once per training step.
	Update float64 `json:"update_s"`
	// OutputBytes is the size of the layer's output per sample (float32).
	OutputBytes int64 `json:"output_bytes"`
	// ParamBytes counts parameters and buffers; TrainableBytes only the
	// parameters the optimizer updates (each has a gradient of the same
	// size, and optimizer state).
	ParamBytes     int64 `json:"param_bytes"`
	TrainableBytes int64 `json:"trainable_bytes"`
	// SlotBytes is the memory the layer holds per micro-batch in flight,
	// per sample: the activations kept from forward to backward and the
	// backward buffers, which nn keeps per micro-batch slot.
	SlotBytes float64 `json:"slot_bytes"`
	// FLOPs is the forward pass's floating-point operations per sample
	// (counted from the layer's shape, not measured).
	FLOPs float64 `json:"flops"`
}

// ModelProfile is the per-layer profile of a model, measured on one node
// (the reference, speed 1) or estimated from FLOP counts. It is JSON so
// that nodes can exchange it.
type ModelProfile struct {
	Model string `json:"model,omitempty"`
	// Graph is the GraphHash of the model the profile belongs to.
	Graph string `json:"graph"`
	// Source is "measured" or "analytic".
	Source  string `json:"source"`
	Backend string `json:"backend,omitempty"`
	Threads int    `json:"threads,omitempty"`
	// GFLOPS is the reference node's GEMM speed (0 if unknown), measured
	// as the layers are: a measured profile's is the median speed of single
	// GEMMs (MeasureGEMMBurst), the speed between two throttles under a CPU
	// quota. A node profile with GFLOPS (its sustained speed, see
	// MeasureGEMMSpeeds) and no Speed gets Speed = its GFLOPS / this,
	// which counts its quota.
	GFLOPS float64 `json:"gflops,omitempty"`
	// Sizes are the micro-batch sizes that were measured.
	Sizes []int `json:"sizes,omitempty"`
	// Layers follow the graph's node order.
	Layers []LayerProfile `json:"layers"`
}

// GraphHash identifies a model's structure: its inputs, and every node's
// name, kind, inputs and output shape. Two graphs with the same hash take
// the same plans and profiles.
func GraphHash(g *nn.Graph) string {
	h := sha256.New()
	w := func(s string) {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	ints := func(v []int) { w(fmt.Sprint(v)) }
	for i, in := range g.InputNames {
		w("input")
		w(in)
		ints(g.InputShapes[i])
	}
	for _, n := range g.Nodes {
		w("node")
		w(n.Name)
		w(n.Layer.Kind())
		for _, in := range n.Inputs {
			w(in)
		}
		ints(n.Shape)
	}
	w("output")
	w(g.Output)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Check reports whether p is a profile of g.
func (p *ModelProfile) Check(g *nn.Graph) error {
	if len(p.Layers) != len(g.Nodes) {
		return fmt.Errorf("%w: profile has %d layers, model %d", ErrProfile, len(p.Layers), len(g.Nodes))
	}
	for i, n := range g.Nodes {
		l := p.Layers[i]
		if l.Name != n.Name {
			return fmt.Errorf("%w: profile layer %d is %q, model layer %q", ErrProfile, i, l.Name, n.Name)
		}
		for _, v := range []float64{l.Forward.Fixed, l.Forward.PerSample, l.Backward.Fixed, l.Backward.PerSample, l.Update, l.SlotBytes} {
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("%w: layer %q has a negative or non-finite value", ErrProfile, l.Name)
			}
		}
		if l.OutputBytes < 0 || l.ParamBytes < 0 || l.TrainableBytes < 0 {
			return fmt.Errorf("%w: layer %q has a negative size", ErrProfile, l.Name)
		}
	}
	if p.Graph != "" && p.Graph != GraphHash(g) {
		return fmt.Errorf("%w: profile is of graph %s, model is %s", ErrProfile, p.Graph, GraphHash(g))
	}
	return nil
}

// ProfileOptions tune a measurement.
type ProfileOptions struct {
	// Sizes are the micro-batch sizes to measure: one (times proportional
	// to the size) or two (fixed cost plus cost per sample).
	Sizes []int
	// Each pass is repeated at least MinReps times and until MinTime has
	// passed, at most MaxReps times; the fastest is kept. Defaults 5, 5 ms,
	// 25.
	MinReps, MaxReps int
	MinTime          time.Duration
	// Memory bounds the tensors of the layers measured at once (default
	// ProfileWindow; a layer larger than it is measured alone).
	Memory int64
	// Available, if set, is the memory this process has: a model with a
	// layer whose tensors need more at the largest size is refused before
	// anything is measured (a file may claim any shape).
	Available int64
	// Quota, if it has a Held, is the CPU quota the process runs under:
	// each pass is timed less what the quota held it back meanwhile, so
	// that a pass longer than the quota lets it run at once is timed at
	// the speed between throttles too.
	Quota Quota
}

// Quota is a CPU quota (cgroup.Throttled): CPUs it grants, and Held, how
// long it has held the process back so far, summed over the CPUs it
// stopped the process on. Since another thread of the process (the
// garbage collector's) may have been stopped beside the one that runs a
// pass, a pass is taken to have run at least its share, CPUs over the
// backend's threads, of its wall time.
type Quota struct {
	CPUs float64
	Held func() time.Duration
}

// layerTensors is the memory measuring n on b samples takes: its inputs,
// output and two slots' activations, about four times inputs and output.
func layerTensors(g *nn.Graph, n *nn.Node, b int) int64 {
	var elems int64
	for _, in := range n.Inputs {
		elems += int64(nn.Size(shapeOf(g, in)))
	}
	return 16 * int64(b) * (elems + int64(nn.Size(n.Shape)))
}

// ProfileWindow is the default ProfileOptions.Memory.
const ProfileWindow = 256 << 20

// Profile measures every layer of g with micro-batches of microBatch
// samples on be: forward and backward time, optimizer-step time, output,
// parameter and per-micro-batch memory. Each layer runs as an nn.Stage of
// its own on random inputs, in training's order (forward through every
// layer, backward in reverse); the parameters, gradients and buffers of g
// are restored afterwards.
func Profile(g *nn.Graph, microBatch int, be nn.Backend) (*ModelProfile, error) {
	return ProfileWith(g, be, ProfileOptions{Sizes: []int{microBatch}})
}

// ProfileWith is Profile with options. A layer that fails on the
// profile's inputs is an ErrProfile, not a panic of the node.
func ProfileWith(g *nn.Graph, be nn.Backend, o ProfileOptions) (prof *ModelProfile, err error) {
	defer func() {
		if r := recover(); r != nil {
			prof, err = nil, fmt.Errorf("%w: a layer failed on the profile's inputs: %v", ErrProfile, r)
		}
	}()
	sizes := slices.Clone(o.Sizes)
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	if len(sizes) == 0 || len(sizes) > 2 || sizes[0] < 1 {
		return nil, fmt.Errorf("%w: profile sizes %v: want one or two positive micro-batch sizes", ErrProfile, o.Sizes)
	}
	if o.MinReps <= 0 {
		o.MinReps = 5
	}
	if o.MaxReps < o.MinReps {
		o.MaxReps = max(25, o.MinReps)
	}
	if o.MinTime <= 0 {
		o.MinTime = 5 * time.Millisecond
	}
	if o.Memory <= 0 {
		o.Memory = ProfileWindow
	}
	if o.Available > 0 {
		b := sizes[len(sizes)-1]
		for _, n := range g.Nodes {
			if need := layerTensors(g, n, b); need > o.Available {
				return nil, fmt.Errorf("%w: layer %s (per sample %v) needs about %.1f GiB at %d samples; %.1f GiB available",
					ErrProfile, n.Name, n.Shape, float64(need)/(1<<30), b, float64(o.Available)/(1<<30))
			}
		}
	}
	restore := snapshot(g)
	defer restore()

	p := &ModelProfile{Graph: GraphHash(g), Source: "measured", Backend: be.Name(), Threads: be.Threads(), Sizes: sizes}
	// The layer timings below are the fastest of their repetitions: another
	// process or a CPU quota's throttle only makes a pass slower. They are
	// the speed between throttles, and so is this reference.
	p.GFLOPS = MeasureGEMMBurst(be, 256, 50*time.Millisecond)
	ctx := &nn.Ctx{Backend: be, Train: true, Seed: 1}
	rng := rand.New(rand.NewPCG(1, 2))
	meas := make([][]sample, len(g.Nodes))
	measure := func(lo, hi, b int) error {
		ms, err := measureLayers(g, ctx, rng, o, lo, hi, b)
		for i, m := range ms {
			meas[lo+i] = append(meas[lo+i], m)
		}
		return err
	}
	for _, b := range sizes {
		// The layers are measured in windows of consecutive layers whose
		// tensors (layerTensors) fit in o.Memory, so that a node can
		// profile a model whose whole micro-batch it could not hold.
		lo, used := 0, int64(0)
		for i, n := range g.Nodes {
			need := layerTensors(g, n, b)
			if i > lo && used+need > o.Memory {
				if err := measure(lo, i, b); err != nil {
					return nil, err
				}
				lo, used = i, 0
			}
			used += need
		}
		if err := measure(lo, len(g.Nodes), b); err != nil {
			return nil, err
		}
	}
	opt, err := nn.NewOptimizer(nn.OptimizerConfig{Name: "sgd", LR: 1e-12, Momentum: 0.9, Threads: be.Threads()})
	if err != nil {
		return nil, err
	}
	// The optimizer's step, timed the same way: every layer's update in
	// turn, repeated.
	upd := make([][]float64, len(g.Nodes))
	params := make([][]*nn.Param, len(g.Nodes))
	for i, n := range g.Nodes {
		for _, q := range n.Layer.Params() {
			if q.Trainable() {
				params[i] = append(params[i], q)
			}
		}
	}
	for r := 0; r < o.MinReps; r++ {
		for i, ps := range params {
			if len(ps) > 0 {
				t0 := time.Now()
				opt.Step(ps)
				upd[i] = append(upd[i], time.Since(t0).Seconds())
			}
		}
	}
	for i, n := range g.Nodes {
		lp := staticProfile(g, n)
		ms := meas[i]
		bmax := sizes[len(sizes)-1]
		lp.SlotBytes = max(ms[len(ms)-1].slot/float64(bmax), float64(lp.OutputBytes))
		lp.Forward = fit(sizes, ms[0].fwd, ms[len(ms)-1].fwd)
		lp.Backward = fit(sizes, ms[0].bwd, ms[len(ms)-1].bwd)
		lp.Update = fastest(upd[i])
		p.Layers = append(p.Layers, lp)
	}
	return p, nil
}

// fit returns the timing through (sizes[0], t0) and (sizes[last], t1),
// with both terms kept non-negative.
func fit(sizes []int, t0, t1 float64) Timing {
	b1 := float64(sizes[len(sizes)-1])
	if len(sizes) == 1 {
		return Timing{PerSample: t1 / b1}
	}
	b0 := float64(sizes[0])
	ps := (t1 - t0) / (b1 - b0)
	f := t0 - ps*b0
	if ps <= 0 || f < 0 {
		return Timing{PerSample: t1 / b1}
	}
	return Timing{Fixed: f, PerSample: ps}
}

// sample is one layer's pass times and the bytes of a slot, at one size.
type sample struct{ fwd, bwd, slot float64 }

// measureLayers times layers lo..hi-1 of g, each as a stage of its own on
// random inputs, at micro-batches of b samples. The passes are timed as
// training runs them, one micro-batch through every layer forward and
// back through every layer in reverse, repeated: a layer's weights are
// then as cold as in a pipeline stage, where the other layers' weights and
// activations pass through the caches between two uses of it (timing one
// layer over and over keeps its weights in cache and measured skinny GEMMs
// up to a quarter too fast).
func measureLayers(g *nn.Graph, ctx *nn.Ctx, rng *rand.Rand, o ProfileOptions, lo, hi, b int) ([]sample, error) {
	type layerRun struct {
		st      *nn.Stage
		in, out []*nn.Tensor
	}
	runs := make([]layerRun, hi-lo)
	for i := range runs {
		n := g.Nodes[lo+i]
		st, err := g.Stage([]string{n.Name})
		if err != nil {
			return nil, err
		}
		r := layerRun{st: st, in: make([]*nn.Tensor, len(st.Inputs)), out: make([]*nn.Tensor, len(st.Outputs))}
		for k, name := range st.Inputs {
			r.in[k] = randomTensor(rng, append([]int{b}, shapeOf(g, name)...))
			if limit := idLimit(n, name); limit > 0 {
				randomIDs(rng, r.in[k], limit)
			}
		}
		for k, name := range st.Outputs {
			r.out[k] = randomTensor(rng, append([]int{b}, g.Node(name).Shape...))
		}
		st.Forward(ctx, 0, r.in) // warm up slot 0
		st.Backward(ctx, 0, r.out)
		runs[i] = r
	}
	// Memory of one micro-batch in flight: what a fresh slot allocates.
	slots := make([]float64, len(runs))
	for i, r := range runs {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		r.st.Forward(ctx, 1, r.in)
		r.st.Backward(ctx, 1, r.out)
		runtime.ReadMemStats(&m1)
		slots[i] = float64(m1.TotalAlloc - m0.TotalAlloc)
	}
	fw, bw := make([][]float64, len(runs)), make([][]float64, len(runs))
	timer := newPassTimer(o.Quota, ctx.Backend.Threads())
	start := time.Now()
	for rep := 0; rep < o.MaxReps && (rep < o.MinReps || time.Since(start) < o.MinTime); rep++ {
		for i, r := range runs {
			timer.start()
			r.st.Forward(ctx, 0, r.in)
			fw[i] = append(fw[i], timer.seconds())
		}
		for i := len(runs) - 1; i >= 0; i-- {
			timer.start()
			runs[i].st.Backward(ctx, 0, runs[i].out)
			bw[i] = append(bw[i], timer.seconds())
		}
	}
	out := make([]sample, len(runs))
	for i := range runs {
		out[i] = sample{fastest(fw[i]), fastest(bw[i]), slots[i]}
		if !g.Nodes[lo+i].RequiresGrad {
			out[i].bwd = 0
		}
	}
	return out, nil
}

// passTimer times a pass: its wall time, less what a CPU quota held the
// process back meanwhile (held, if set) shared among threads (Quota).
type passTimer struct {
	held    func() time.Duration
	now     func() time.Time
	threads int
	floor   float64 // the least share of the wall time a pass ran
	t0      time.Time
	h0      time.Duration
}

func newPassTimer(q Quota, threads int) *passTimer {
	p := &passTimer{held: q.Held, now: time.Now, threads: max(1, threads)}
	if q.CPUs > 0 {
		p.floor = min(1, q.CPUs/float64(p.threads))
	}
	return p
}

func (p *passTimer) start() {
	if p.held != nil {
		p.h0 = p.held()
	}
	p.t0 = p.now()
}

// seconds is the pass's time since start, at least floor of its wall time.
func (p *passTimer) seconds() float64 {
	wall := p.now().Sub(p.t0)
	if p.held == nil {
		return wall.Seconds()
	}
	d := wall - (p.held()-p.h0)/time.Duration(p.threads)
	return max(d.Seconds(), p.floor*wall.Seconds())
}

// fastest is the smallest of v (0 for none).
func fastest(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return slices.Min(v)
}

// Median is the median of v (the upper one of an even count; 0 for none).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func shapeOf(g *nn.Graph, name string) []int {
	if n := g.Node(name); n != nil {
		return n.Shape
	}
	for i, in := range g.InputNames {
		if in == name {
			return g.InputShapes[i]
		}
	}
	panic("balance: no tensor " + name) // unreachable: names come from nn.Stage
}

// idLimit is, when layer n reads the tensor name as integer ids (an
// embedding's tokens), their bound; 0 otherwise.
func idLimit(n *nn.Node, name string) int {
	ids, ok := n.Layer.(interface{ IntInput(i int) (int, bool) })
	if !ok {
		return 0
	}
	for i, in := range n.Inputs {
		if in == name {
			if limit, ok := ids.IntInput(i); ok {
				return limit
			}
		}
	}
	return 0
}

// randomIDs fills t with integers in [0, limit).
func randomIDs(r *rand.Rand, t *nn.Tensor, limit int) {
	d := nn.F32(t)
	for i := range d {
		d[i] = float32(r.IntN(limit))
	}
}

func randomTensor(r *rand.Rand, shape []int) *nn.Tensor {
	t := nn.New(shape...)
	d := nn.F32(t)
	for i := range d {
		d[i] = float32(r.NormFloat64())
	}
	return t
}

// snapshot saves every parameter's value and gradient of g and returns a
// function that puts them back.
func snapshot(g *nn.Graph) func() {
	type saved struct {
		p         *nn.Param
		val, grad []float32
	}
	var s []saved
	for _, p := range g.Params() {
		v := saved{p: p, val: slices.Clone(nn.F32(p.Value))}
		if p.Grad != nil {
			v.grad = slices.Clone(nn.F32(p.Grad))
		}
		s = append(s, v)
	}
	return func() {
		for _, v := range s {
			copy(nn.F32(v.p.Value), v.val)
			if v.grad != nil {
				copy(nn.F32(v.p.Grad), v.grad)
			}
		}
	}
}

// MeasureGEMMBurst returns be's speed in GFLOP/s on n×n matrices from the
// median time of single GEMMs run for about d: the speed between two
// throttles of a CPU quota, as the median layer timings of a profile are.
func MeasureGEMMBurst(be nn.Backend, n int, d time.Duration) float64 {
	_, burst := MeasureGEMMSpeeds(be, n, d)
	return burst
}

// MeasureGEMMSpeeds runs n×n GEMMs on be for about d (at least twice,
// after one to warm up) and returns both speeds in GFLOP/s: sustained, the
// GEMMs done over the time they took, which over whole periods of a CPU
// quota (100 ms by default) counts the quota in (a node at 60% of a CPU
// measures about 60% of its burst speed), and burst (MeasureGEMMBurst).
func MeasureGEMMSpeeds(be nn.Backend, n int, d time.Duration) (sustained, burst float64) {
	times, total := gemmRuns(be, n, d)
	flops := 2 * float64(n) * float64(n) * float64(n)
	return flops * float64(len(times)) / total.Seconds() / 1e9, flops / Median(times) / 1e9
}

// gemmRuns runs n×n GEMMs on be for about d (at least twice, after one to
// warm up); it returns each one's time in seconds and the total.
func gemmRuns(be nn.Backend, n int, d time.Duration) ([]float64, time.Duration) {
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i] = float32(i%7) - 3
		b[i] = float32(i%5) - 2
	}
	be.Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
	var times []float64
	start := time.Now()
	for time.Since(start) < d || len(times) < 2 {
		t0 := time.Now()
		be.Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
		times = append(times, time.Since(t0).Seconds())
	}
	return times, time.Since(start)
}

// staticProfile fills what a layer's shape tells: sizes and FLOPs.
func staticProfile(g *nn.Graph, n *nn.Node) LayerProfile {
	lp := LayerProfile{Name: n.Name, Kind: n.Layer.Kind(), OutputBytes: 4 * int64(nn.Size(n.Shape))}
	for _, p := range n.Layer.Params() {
		b := 4 * int64(nn.Size(p.Value.Shape()))
		lp.ParamBytes += b
		if p.Trainable() {
			lp.TrainableBytes += b
		}
	}
	c := countLayer(g, n)
	lp.FLOPs = c.gemmF + c.elemF
	return lp
}

// layerCount is a layer's work per sample: GEMM FLOPs and elementwise
// operations of each pass, and the bytes it keeps per sample in flight.
type layerCount struct {
	gemmF, gemmB, elemF, elemB float64
	slot                       float64
}

// countLayer counts a layer's work from the exported fields of the layer
// types nn defines; other layers count one elementwise operation per output
// element and pass.
func countLayer(g *nn.Graph, n *nn.Node) layerCount {
	out := float64(nn.Size(n.Shape))
	inNeed := false
	inSize := 0.0
	for _, in := range n.Inputs {
		inSize += float64(nn.Size(shapeOf(g, in)))
		if !g.IsInput(in) && g.Node(in).RequiresGrad {
			inNeed = true
		}
	}
	var c layerCount
	c.slot = 4 * out
	if inNeed {
		c.slot += 4 * inSize // input gradients
	}
	switch l := n.Layer.(type) {
	case *nn.Linear:
		f := 2 * float64(l.In) * float64(l.Out) * out / float64(l.Out) // per position
		c.gemmF = f
		if !nn.Frozen(l) {
			c.gemmB = f
		}
		if inNeed {
			c.gemmB += f
		}
		c.elemF, c.elemB = out, out
	case *nn.MatMul:
		// out = L·M·P products of K terms; K is the shared axis of A.
		a := shapeOf(g, n.Inputs[0])
		k := a[len(a)-1]
		if l.TransA {
			k = a[len(a)-2]
		}
		f := 2 * out * float64(k)
		c.gemmF, c.gemmB = f, 2*f
	case *nn.LSTM, *nn.GRU:
		in, h, gates := 0, 0, 0
		switch r := l.(type) {
		case *nn.LSTM:
			in, h, gates = r.In, r.Hidden, 4
		case *nn.GRU:
			in, h, gates = r.In, r.Hidden, 3
		}
		steps := out / float64(h)
		f := 2 * steps * float64(gates*h) * float64(in+h)
		c.gemmF, c.gemmB = f, 2*f
		c.elemF, c.elemB = 8*steps*float64(gates*h), 12*steps*float64(gates*h)
		c.slot += 4 * steps * float64(2*gates*h)
	case *nn.ConvTranspose2D:
		f := 2 * inSize * float64(l.Out/l.Groups) * float64(l.KH*l.KW)
		c.gemmF, c.gemmB = f, 2*f
		c.elemF, c.elemB = inSize*float64(l.KH*l.KW), inSize*float64(l.KH*l.KW)
	case *nn.LayerNorm:
		c.elemF, c.elemB = 5*out, 8*out
	case *nn.Conv2D:
		ho, wo := float64(n.Shape[0]), float64(n.Shape[1])
		kc := float64(l.KH * l.KW * l.In / l.Groups)
		f := 2 * kc * float64(l.Out) * ho * wo
		c.gemmF = f
		if !nn.Frozen(l) {
			c.gemmB = f
		}
		if inNeed {
			c.gemmB += f
		}
		direct := l.KH == 1 && l.KW == 1 && l.SH == 1 && l.SW == 1 && l.PadT+l.PadL+l.PadB+l.PadR == 0
		if !direct {
			kc *= float64(l.Groups) // the im2col matrix holds every group's columns
			c.elemF, c.elemB = ho*wo*kc, ho*wo*kc
			c.slot += 4 * ho * wo * kc // the im2col matrix, kept for backward
		}
	case *nn.BatchNorm:
		c.elemF, c.elemB = 6*out, 8*out
	case *nn.MaxPool2D:
		c.elemF, c.elemB = float64(l.KH*l.KW)*out, inSize
	case *nn.AvgPool2D:
		c.elemF, c.elemB = float64(l.KH*l.KW)*out, float64(l.KH*l.KW)*out
	case nn.Flatten, *nn.Flatten, *nn.Reshape:
		c.slot = 0
	default:
		c.elemF, c.elemB = max(out, inSize), max(out, inSize)
	}
	if !n.RequiresGrad {
		c.gemmB, c.elemB = 0, 0
	}
	return c
}

// AnalyticOptions set the speeds of an estimated profile.
type AnalyticOptions struct {
	// GFLOPS is the reference node's GEMM speed (default 10).
	GFLOPS float64
	// ElemPerSec is its speed on elementwise work, in elements per second
	// (default 1e9).
	ElemPerSec float64
	// Overhead is a fixed cost per layer and pass (default 0).
	Overhead time.Duration
}

// Analytic estimates a profile of g from FLOP counts, for planning without
// measuring and for tests that need exact, repeatable costs.
func Analytic(g *nn.Graph, o AnalyticOptions) *ModelProfile {
	if o.GFLOPS <= 0 {
		o.GFLOPS = 10
	}
	if o.ElemPerSec <= 0 {
		o.ElemPerSec = 1e9
	}
	ov := o.Overhead.Seconds()
	p := &ModelProfile{Graph: GraphHash(g), Source: "analytic", GFLOPS: o.GFLOPS}
	for _, n := range g.Nodes {
		lp := staticProfile(g, n)
		c := countLayer(g, n)
		lp.Forward = Timing{Fixed: ov, PerSample: c.gemmF/(o.GFLOPS*1e9) + c.elemF/o.ElemPerSec}
		if n.RequiresGrad {
			lp.Backward = Timing{Fixed: ov, PerSample: c.gemmB/(o.GFLOPS*1e9) + c.elemB/o.ElemPerSec}
		}
		lp.Update = 3 * float64(lp.TrainableBytes/4) / o.ElemPerSec
		lp.SlotBytes = c.slot
		p.Layers = append(p.Layers, lp)
	}
	return p
}
