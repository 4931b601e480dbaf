// Package job owns what a job is: its description ([Spec]) and validation,
// preparing its model and data ([Spec.Prepare]), single-process training
// ([Job.TrainLocal], the reference every pipelined run reproduces), its
// progress as reported ([Status]), and the pure core that runs a pipelined
// job ([Core]): events in, actions out, time as an input.
package job
