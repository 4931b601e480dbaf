// Package core is the pure core of one pipelined job ([Core]): a state
// machine that takes events ([Core.Step], [Core.Tick]) and returns the
// operations to carry out ([Core.Ready]). The runtime (package actors)
// carries the operations out and reports their outcomes back as events.
//
// # What it owns
//
//   - the events in and the actions out (events.go), numbered by [Op];
//   - plan changes, the one transition behind the start, a takeover, a
//     recovery from a failure and every re-plan (change.go);
//   - rebalancing and the checkpoint interval (policy.go);
//   - the links between nodes as measured by probes and traffic (links.go);
//   - the bookkeeping of steps, cuts and losses that the job's status
//     ([job.Status]) and result ([job.Result]) report.
//
// # Purity
//
// The core owns no goroutine, socket, file or clock: time is an argument
// of every call, and it is used from one goroutine. It plans with
// balance.Search on the caller's goroutine, which reads no clock, so the
// same events at the same times give the same actions. layering_test.go
// holds it to this: its files import no os, net, syscall, math/rand,
// runtime or sync, read or wait for no clock (time.Now, time.Sleep,
// timers), and start no goroutine.
//
// What a job is (its [job.Spec], the prepared [job.Job], its [job.Status])
// is package job's; the core imports it, never the reverse.
package core
