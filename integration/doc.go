// Package integration tests ppnode as a user runs it: real `ppnode join`
// processes on 127.0.0.1, jobs submitted through their HTTP API or through
// `ppnode train --via`, and the results compared with single-process
// training (`ppnode train --local`).
//
// # Harness
//
// [Binary] builds bin/ppnode once per test binary, with the tags the
// Makefile uses (OpenBLAS when libopenblas is installed). [StartCluster]
// starts nodes that bind port 0 and reads the addresses they chose from
// their ready line:
//
//	ready {"name":"a","gossip":"127.0.0.1:X","actors":"127.0.0.1:Y","http":"127.0.0.1:Z"}
//
// A node may get a CPU quota (a fraction of one CPU) through a cgroup v1
// directory /sys/fs/cgroup/cpu/ppnode-test-<pid>-<name>; the node enters
// its cgroup before it execs, so its start-up profile already sees the
// quota. Where that directory cannot be made (not root, no cgroup v1 cpu
// controller), [RequireCPUQuota] skips the test and says why.
//
// Every wait has a deadline and waits on an event: a ready line, a
// process exit, an HTTP answer. After each test the harness stops its
// nodes (SIGTERM, SIGKILL after a deadline, and an error if a node needed
// it or exited non-zero), removes their cgroups and checks for leaks: no
// child process of the test binary is left and nothing listens on a
// node's ports any more.
//
// # Tests
//
// Exactness: jobs on 1 to 4 nodes, GPipe and 1F1B, automatic and
// hand-written partitions, mlp32 and uno, and on nodes with unequal CPU
// quotas, give the weights_sha256 of `ppnode train --local
// --deterministic`. Membership: a node that joins
// during a job does not change its result; a node that leaves while idle
// is gone from the others' membership within 2 s. Refusals: an unknown
// model, a partition that misses a layer and more stages than nodes are
// answered 400 with a clear message, and no job starts. `ppnode demo`
// runs a short job and leaves no process or cgroup behind. With -short a
// reduced set of exactness cases runs.
package integration
