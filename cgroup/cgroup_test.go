package cgroup

import (
	"testing"
	"testing/fstest"
	"time"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestCPULimit(t *testing.T) {
	v1Mounts := "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
		"32 30 0:29 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
	v2Mounts := "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  float64 // 0: no limit
	}{
		{"v1 quota", fstest.MapFS{
			"proc/self/cgroup":                          file("2:cpuacct:/\n1:cpu:/job/b\n0::/\n"),
			"proc/self/mountinfo":                       file(v1Mounts),
			"sys/fs/cgroup/cpu/job/b/cpu.cfs_quota_us":  file("25000\n"),
			"sys/fs/cgroup/cpu/job/b/cpu.cfs_period_us": file("100000\n"),
			"sys/fs/cgroup/cpu/job/cpu.cfs_quota_us":    file("-1\n"),
			"sys/fs/cgroup/cpu/job/cpu.cfs_period_us":   file("100000\n"),
			"sys/fs/cgroup/cpu/cpu.cfs_quota_us":        file("-1\n"),
			"sys/fs/cgroup/cpu/cpu.cfs_period_us":       file("100000\n"),
		}, 0.25},
		{"v1 parent's quota is smaller", fstest.MapFS{
			"proc/self/cgroup":    file("1:cpu,cpuacct:/job/b\n"),
			"proc/self/mountinfo": file("31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"),
			"sys/fs/cgroup/cpu,cpuacct/job/b/cpu.cfs_quota_us":  file("150000"),
			"sys/fs/cgroup/cpu,cpuacct/job/b/cpu.cfs_period_us": file("100000"),
			"sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us":    file("50000"),
			"sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us":   file("100000"),
		}, 0.5},
		{"v2 cpu.max", fstest.MapFS{
			"proc/self/cgroup":    file("0::/system.slice/ppnode.service\n"),
			"proc/self/mountinfo": file(v2Mounts),
			"sys/fs/cgroup/system.slice/ppnode.service/cpu.max": file("150000 100000\n"),
			"sys/fs/cgroup/system.slice/cpu.max":                file("max 100000\n"),
		}, 1.5},
		{"v2 in a container (mount root is the cgroup)", fstest.MapFS{
			"proc/self/cgroup":      file("0::/kubepods/pod1\n"),
			"proc/self/mountinfo":   file("29 23 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"),
			"sys/fs/cgroup/cpu.max": file("200000 100000\n"),
		}, 2},
		{"v2 no limit", fstest.MapFS{
			"proc/self/cgroup":        file("0::/a\n"),
			"proc/self/mountinfo":     file(v2Mounts),
			"sys/fs/cgroup/a/cpu.max": file("max 100000\n"),
		}, 0},
		{"garbage", fstest.MapFS{
			"proc/self/cgroup":      file("::::\n0::\nx\n"),
			"proc/self/mountinfo":   file("- - -\n1 2 3\n" + v2Mounts),
			"sys/fs/cgroup/cpu.max": file("12 zero\n"),
		}, 0},
		{"no proc", fstest.MapFS{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := CPUsIn(tc.files)
			if ok != (tc.want > 0) || got != tc.want && ok {
				t.Errorf("CPUsIn = %v, %v; want %v", got, ok, tc.want)
			}
		})
	}
}

func TestMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  int64 // 0: no limit
	}{
		{"v1, the node's own cgroup", fstest.MapFS{
			"proc/self/cgroup":    file("5:memory:/bench/b\n1:cpu:/bench/b\n"),
			"proc/self/mountinfo": file("33 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"),
			"sys/fs/cgroup/memory/bench/b/memory.limit_in_bytes": file("1073741824\n"),
			"sys/fs/cgroup/memory/bench/memory.limit_in_bytes":   file("9223372036854771712\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes":         file("9223372036854771712\n"),
		}, 1 << 30},
		{"v2, a parent's", fstest.MapFS{
			"proc/self/cgroup":    file("0::/system.slice/ppnode.service\n"),
			"proc/self/mountinfo": file("29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
			"sys/fs/cgroup/system.slice/ppnode.service/memory.max": file("max\n"),
			"sys/fs/cgroup/system.slice/memory.max":                file("2147483648\n"),
		}, 2 << 30},
		{"v1 unlimited", fstest.MapFS{
			"proc/self/cgroup":                           file("5:memory:/\n"),
			"proc/self/mountinfo":                        file("33 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := MemoryIn(tc.files)
			if tc.want == 0 && ok || tc.want != 0 && (!ok || got != tc.want) {
				t.Fatalf("MemoryIn = %d, %v; want %d", got, ok, tc.want)
			}
		})
	}
}

// The time held back is read, as it grows, from the cpu.stat of every
// level that sets a quota (v1 in nanoseconds, v2 in microseconds); no
// quota, no reader.
func TestThrottled(t *testing.T) {
	fsys := fstest.MapFS{
		"proc/self/cgroup":    file("1:cpu,cpuacct:/job/b\n0::/s\n"),
		"proc/self/mountinfo": file("31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n29 23 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"),
		"sys/fs/cgroup/cpu,cpuacct/job/b/cpu.cfs_quota_us":  file("25000"),
		"sys/fs/cgroup/cpu,cpuacct/job/b/cpu.cfs_period_us": file("100000"),
		"sys/fs/cgroup/cpu,cpuacct/job/b/cpu.stat":          file("nr_periods 10\nnr_throttled 4\nthrottled_time 300000000\n"),
		"sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us":    file("-1"),
		"sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us":   file("100000"),
		"sys/fs/cgroup/cpu,cpuacct/job/cpu.stat":            file("throttled_time 999\n"),
		"sys/fs/cgroup/unified/s/cpu.max":                   file("50000 100000\n"),
		"sys/fs/cgroup/unified/s/cpu.stat":                  file("usage_usec 5\nthrottled_usec 2000\n"),
	}
	cpus, held := ThrottledIn(fsys)
	if held == nil || cpus != 0.25 {
		t.Fatalf("under two quotas: %v CPUs, reader %v; want the smaller, 0.25, and a reader", cpus, held != nil)
	}
	if got, want := held(), 302*time.Millisecond; got != want {
		t.Errorf("held %v, want %v", got, want)
	}
	fsys["sys/fs/cgroup/cpu,cpuacct/job/b/cpu.stat"] = file("throttled_time 400000000\n")
	if got, want := held(), 402*time.Millisecond; got != want {
		t.Errorf("held %v after more throttling, want %v", got, want)
	}
	if _, held := ThrottledIn(fstest.MapFS{"proc/self/cgroup": file("0::/a\n"), "proc/self/mountinfo": file("29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
		"sys/fs/cgroup/a/cpu.max": file("max 100000\n")}); held != nil {
		t.Error("a reader without a quota")
	}
}
