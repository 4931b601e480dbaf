package nn

// Ctx is what a layer needs to know about the pass it runs in.
type Ctx struct {
	Backend Backend
	// Train selects training behaviour (batch statistics, dropout).
	Train bool
	// Seed, Step and Micro seed per-micro-batch randomness (dropout).
	Seed        uint64
	Step, Micro int
	// Recompute marks a forward pass that repeats one already run for the
	// same micro-batch (activation recomputation): it computes the same
	// outputs, and layers leave their running statistics as they are.
	Recompute bool

	// team: the pass runs on the team thread, and the fast path threads
	// with OpenMP from it (team.go).
	team bool
}

// SplitLayer is a Layer whose backward pass can run as two passes (for
// zero-bubble pipeline schedules): BackwardInput returns the input
// gradients as Backward does, without touching the parameters' Grad;
// BackwardWeight, later, with the same in, out and dout, adds the
// parameter gradients as Backward does. Together they compute Backward's
// results bit for bit. BackwardWeight may read only what Forward and
// BackwardInput left in s, and the slot takes no other pass in between.
type SplitLayer interface {
	Layer
	// Splits reports whether the layer splits its backward pass in
	// context c (a layer whose fast path computes both at once does not).
	Splits(c *Ctx) bool
	BackwardInput(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor
	BackwardWeight(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor)
}

// Layer is one node's computation. Shapes passed to Build are per sample
// (without the batch dimension); tensors passed to Forward and Backward have
// the batch first.
//
// A layer keeps nothing of a pass but what it writes into the Slot it is
// given, so one layer serves several micro-batches in flight.
type Layer interface {
	// Kind names the layer type, for plans and errors ("linear", "conv2d").
	Kind() string
	// Build checks the input shapes and returns the output shape. It is
	// called once, when the layer is added to a graph.
	Build(in [][]int) ([]int, error)
	// Params returns the layer's parameters and buffers with names relative
	// to the layer ("weight", "bias", "running_mean").
	Params() []*Param
	// Forward computes the output into a buffer of s.
	Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor
	// Backward adds the parameter gradients of this micro-batch to the
	// Params' Grad and returns the gradient of each input for which need[i]
	// is set (nil for the others). in and out are Forward's.
	Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor
}
