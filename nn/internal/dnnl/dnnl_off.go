//go:build !(cgo && dnnl)

package dnnl

// Available reports whether oneDNN is compiled in.
const Available = false

// Conv and Pool cannot be made without oneDNN, nor the kernels run; their
// methods exist so that callers compile.
type (
	Conv struct{}
	Pool struct{}
)

func NewConv(g ConvGeom) (*Conv, error)                             { return nil, ErrUnavailable }
func NewPool(g PoolGeom) (*Pool, error)                             { return nil, ErrUnavailable }
func (*Conv) Impl() [3]string                                       { panic(ErrUnavailable) }
func (*Conv) Forward(threads int, x, w, b, y []float32) error       { panic(ErrUnavailable) }
func (*Conv) BackwardData(threads int, dy, w, dx []float32) error   { panic(ErrUnavailable) }
func (*Conv) BackwardWeights(threads int, x, dy []float32) error    { panic(ErrUnavailable) }
func (*Conv) AddGrads(threads int, dw, db []float32) error          { panic(ErrUnavailable) }
func (*Pool) Workspace() int                                        { panic(ErrUnavailable) }
func (*Pool) Forward(threads int, x, y []float32, ws []int32) error { panic(ErrUnavailable) }
func (*Pool) Backward(threads int, dy []float32, ws []int32, dx []float32) error {
	panic(ErrUnavailable)
}
func BNStats(x []float32, c int, shift []float32, s1, s2 []float64) { panic(ErrUnavailable) }
func BNNormalize(x, y []float32, c int, mean, scale, bias []float32, relu bool) {
	panic(ErrUnavailable)
}
func BNGradSums(x, y, dy []float32, c int, mean, inv []float32, sdy, sdyx []float64) {
	panic(ErrUnavailable)
}
func BNInputGrad(x, y, dy, dx []float32, c int, mean, inv, k, a, b []float32) { panic(ErrUnavailable) }
func BNStatsTeam(chunks int, x []float32, c int, shift []float32, parts []float64) {
	panic(ErrUnavailable)
}
func BNNormalizeTeam(chunks int, x, y []float32, c int, mean, scale, bias []float32, relu bool) {
	panic(ErrUnavailable)
}
func BNGradSumsTeam(chunks int, x, y, dy []float32, c int, mean, inv []float32, parts []float64) {
	panic(ErrUnavailable)
}
func BNInputGradTeam(chunks int, x, y, dy, dx []float32, c int, mean, inv, k, a, b []float32) {
	panic(ErrUnavailable)
}
func ElementwiseTeam(chunks, op int, a, b, y []float32) { panic(ErrUnavailable) }
