// Package onnx turns an ONNX model exported from PyTorch into a ppnode
// graph: the forward graph becomes nn layers (backward is ppnode's own), the
// initializers the initial weights, named as in the PyTorch state_dict.
//
// # What it reads
//
// A model saved by torch.onnx.export (any opset from 9 to 21; training
// mode keeps BatchNormalization and Dropout) whose inputs are float
// features or integer ids [batch, ...], matched to the data's arrays by
// name, and whose one output is the logits. The operators are those of
// MLPs, CNNs, transformers, recurrent nets and branching models (see
// [Supported]); an operator outside them is refused before anything trains,
// each one named once with its nodes, beside the list.
//
// # How it reads it
//
//   - Values: every tensor computed from the data is stored batch first and
//     seen through a view (value.go): Transpose, Reshape, Squeeze and the
//     like change only the view, and data moves only where a layer needs
//     another order.
//   - Constants: shape arithmetic, masks and indices are folded when the
//     model is built, the batch size a symbol; a constant made of
//     initializer elements remembers which, so that a weight the exporter
//     transposed, sliced or reordered (an LSTM's gates) is still trained as
//     the module's parameter.
//   - Patterns: fuse.go replaces what the exporter writes for one module
//     (LayerNorm, GELU, a Linear on [B, T, F], hardswish) by one layer;
//     an Einsum that is a product becomes the transposes, reshapes and
//     MatMul one would write by hand; a bidirectional recurrence is two
//     layers, the backward one reading the steps reversed.
//   - Masks from the data (padding): comparisons of ids, Where, Expand and
//     integer arithmetic on ids are layers whose outputs carry no gradient.
//   - Tied weights: an initializer that several layers train is a copy per
//     layer, of one name (nn.Ties), its gradients summed before each step;
//     the file's metadata key TiedKey gives its other state_dict names.
//     A Linear's weight that is rows of a larger initializer (cross-
//     attention's part of in_proj_weight) is the whole one's product and
//     a slice of its outputs.
//   - One row of each sample at an index from the data, x[torch.arange(N),
//     i]: torch.arange over the batch is followed through the exporter's
//     arithmetic into one nn.Pick (pick.go) and refused anywhere else.
//
// The protobuf code in onnxpb is generated from the official onnx.proto
// (`make proto`).
//
// # Errors
//
// Everything here comes from a user's file: every problem is an error
// wrapping [ErrModel], never a panic, and nothing is allocated beyond what
// the file's own bytes hold.
package onnx
