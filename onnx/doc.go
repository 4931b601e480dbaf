// Package onnx turns an ONNX model exported from PyTorch into a ppnode
// graph: the forward graph becomes nn layers (backward is ppnode's own), the
// initializers the initial weights, named as in the PyTorch state_dict.
//
// # What it reads
//
// A model saved by torch.onnx.export (any opset from 9 to 21; training
// mode keeps BatchNormalization and Dropout) whose one data input is a
// float tensor [batch, ...] and whose one output is the logits [batch,
// classes]. The operators are those of MLPs, CNNs and branching models (see
// [Supported]); an operator outside them is refused before anything trains,
// with its type, its node name and the list. The protobuf code in onnxpb is
// generated from the official onnx.proto (`make proto`).
//
// # Layout
//
// ONNX is NCHW; ppnode's convolutions are NHWC. Each value keeps its ONNX
// (logical) shape and a flag saying whether it is stored channels-last; a
// Permute is inserted only where an operator needs the other layout (a
// Flatten of a feature map, a Reshape, a Transpose). Convolution weights are
// stored OHWI and carry their OIHW layout (nn.Param.Layout), so exported
// weights load into the PyTorch module as they are.
//
// # Errors
//
// Everything here comes from a user's file: every problem is an error
// wrapping [ErrModel], never a panic, and nothing is allocated beyond what
// the file's own bytes hold.
package onnx
