// Package integration tests ppnode as a user runs it: real `ppnode join`
// processes on 127.0.0.1, jobs submitted through their HTTP API or through
// `ppnode train --via`, and the results compared with single-process
// training (`ppnode train --local`).
//
// # Harness
//
// [Binary] builds bin/ppnode once per test binary, with the tags the
// Makefile uses (OpenBLAS when libopenblas is installed), unless
// $PPNODE_TEST_BINARY names one (make test builds it first). [StartCluster]
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
// process exit, an HTTP answer, a log line. After each test the harness
// stops its nodes (SIGCONT to a paused one, SIGTERM, SIGKILL after a
// deadline, and an error if a node needed it or exited non-zero), removes
// their cgroups and checks that each of its node processes has exited;
// tests that mostly wait run four at a time (go test -parallel 4), so
// TestMain checks at the end that no child process of the test binary, and
// no process of the ppnode binary it built, is left.
//
// Faults: [Cluster.Kill] (SIGKILL), [Cluster.Pause] and [Cluster.Resume]
// (SIGSTOP, SIGCONT), [Cluster.Stop] (SIGTERM: a graceful leave), and,
// between nodes in network namespaces, [Network.Cut], [Network.SetRate]
// (a link's rate in one direction) and [Network.Restore].
//
// # Network namespaces
//
// [NewNetCluster] runs each node in a network namespace of its own,
// joined to a bridge in a hub namespace by a veth pair (10.213.0.0/24; the
// hub's bridge is .1, the nodes .11, .12, ...). The root namespace is left
// alone: the test reaches the nodes' HTTP APIs through sockets it opens
// inside the hub namespace. [Network.Cut] drops every packet between two
// nodes, both ways, in the hub: an htb qdisc on each node's hub-side veth
// sends the packets from the other's address to a pfifo of limit 0 (this
// kernel has neither netem nor the gact drop action, nor iptables or nft
// tools). The senders' kernels see silence, as on a cut cable: TCP
// connections stay open, retransmit and probe with backoff, and break only
// by their own timeouts (a drop at the sender's own qdisc would read as
// local congestion, which TCP retries forever). Namespaces are
// named ppnt-<pid>-<seq>-<node>; they are removed after the nodes are
// stopped (the test fails if a process is still in one, or one is left),
// and a later test run removes those of a test process that died. Without
// root, ip, tc or the kernel's support, [RequireNetns] skips the test and
// says why; every other test runs on 127.0.0.1 as before.
//
// # Scenarios
//
// Fault-injection tests are cockroachdb/datadriven scripts in
// testdata/scenarios/*.txt, run by [RunScenarios] (TestScenarios), one
// subtest per file; a failure names the file and line. A directive a step,
// followed by "----" and an empty expected output; arguments are
// key=value, a value with blanks or commas in parentheses, a list
// (A, B); # starts a comment:
//
//	slow                           skipped with -short
//	start n=N [threads=T] [quota=(Q, ...)] [netns]
//	                               nodes a, b, c, ... (netns: each in its
//	                               own network namespace); waits until a
//	                               sees them all
//	train model=M key=value...     submits one deterministic job to a (or
//	                               via=NODE): width data samples batch
//	                               micro epochs steps partition schedule
//	                               checkpoint_every optimizer lr seed
//	                               max_nodes no_rebalance id
//	at step=N                      waits until the job has trained N steps
//	                               and trains
//	kill|stop|cont|leave NODE      SIGKILL, SIGSTOP, SIGCONT, SIGTERM (and
//	                               waits until it has left)
//	cut X Y, restore X Y           the link between X and Y (netns clusters)
//	wait recovery=N                N recoveries listed and a step completed
//	                               after the last
//	wait state=S                   e.g. paused (a recovery attempt failed)
//	wait alive=(NODE, MEMBER)      NODE sees MEMBER alive
//	wait log=NODE                  a line of NODE's stderr holds the text
//	                               given below the directive
//	expect done|failed CHECK...    waits for the job's end, then checks:
//	                               recoveries=N replans=N min_replans=N
//	                               max_replayed=N max_recovery_ms=N (every
//	                               recovery's), sha=fault-free (the job
//	                               trained in this process) or a hex digest,
//	                               cause=(TEXT) replan=(TEXT) error=(TEXT)
//	                               (contain TEXT)
//
// The waits take within=D (defaults: 2 min for the job's steps, 3 min for
// its end, 30 s for other events). The scenario reads its job's status
// every 10 ms; after the run it logs, for each fault, a line starting
// "measure:" with the time from the fault to the first step completed
// after the recovery that followed it (seen from the test, within the 10
// ms), the coordinator's detect and restore times and the steps replayed.
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
//
// Faults (scenarios): a stage node killed mid-job; two killed one after
// the other; one hung (SIGSTOP) until the job recovered without it, then
// continued, its old stage fenced off by the plan generation; the link
// between two stage nodes cut until a recovery attempt failed on it, then
// restored; the link between the coordinator's node and a stage node cut,
// the old stage freeing itself once its coordinator link's keepalive
// fails; a graceful leave. Each job ends with the weights of the run
// without the fault and replays at most K steps per recovery. With -short
// only the single kill runs. TestNetworkCut checks the cut itself: only
// the two nodes lose each other, both ways, until Restore; TestNetworkRate
// checks a shaped rate and the link probe's measurement of it.
//
// Links (PPNODE_LINKS=1, bench/links.sh): jobs on three namespaced nodes
// with shaped links, timed, for BENCHMARKS.md: automatic codecs against
// raw frames, a slow node's links, a link that slows mid-job, --wire int8,
// and PyTorch DDP (bench/ddp_gloo.py) on the same links.
package integration
