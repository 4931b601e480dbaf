// Package job owns what a job is: its description ([Spec]) and validation,
// its memory estimated from shapes alone ([Spec.Estimate]; a job over the
// members' memory, or over the preparing process's, is refused before its
// model is built), preparing its model and data ([Spec.Prepare]),
// single-process training ([Job.TrainLocal], the reference every pipelined
// run reproduces), and its progress as reported ([Status], [Result]).
// The pure core that runs a pipelined job, events in and actions out with
// time as an input, is package job/core, which imports this one.
//
// A job is planning, starting, training, recovering, paused or evaluating
// until it ends done (with a [Result]), failed, or diverged: a step's loss
// became NaN or infinite ([CheckLoss], the one rule of the core and of
// TrainLocal), and Status.Error says at which step.
package job
