// Package cgroup reads the limits a process's control group sets on it:
// the CPU quota and the memory limit, cgroup v2 or v1, the smallest along
// the path from its own cgroup up to the root (the way the Go runtime
// reads the CPU limit for GOMAXPROCS), and how long the CPU quotas have
// held it back.
package cgroup

import (
	"bufio"
	"bytes"
	"io/fs"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
	"time"
)

// CPUs returns the CPU limit of this process's cgroup in CPUs (1.5: one
// and a half CPUs), the smallest along the path from its cgroup up to the
// hierarchy's root, cgroup v2 or v1 alike; ok is false if there is no
// limit or it cannot be read.
func CPUs() (cpus float64, ok bool) { return CPUsIn(os.DirFS("/")) }

// CPUsIn is CPUs on the file system root (for tests).
func CPUsIn(root fs.FS) (float64, bool) { return limit(root, "cpu", readV1, readV2) }

// Memory returns the memory limit of this process's cgroup in bytes, the
// smallest along the path up to the root, cgroup v2 or v1; ok is false if
// there is none or it cannot be read.
func Memory() (bytes int64, ok bool) { return MemoryIn(os.DirFS("/")) }

// MemoryIn is Memory on the file system root (for tests).
func MemoryIn(root fs.FS) (int64, bool) {
	b, ok := limit(root, "memory", readMemV1, readMemV2)
	return int64(b), ok
}

// Throttled returns the CPU limit of this process's cgroup (as CPUs does)
// and a function that reports how long the quotas of its cgroup and its
// ancestors have held it back so far (cpu.stat: throttled_time in v1,
// throttled_usec in v2; summed over the CPUs a quota stopped it on); held
// is nil if no quota applies.
func Throttled() (cpus float64, held func() time.Duration) { return ThrottledIn(os.DirFS("/")) }

// ThrottledIn is Throttled on the file system root (for tests).
func ThrottledIn(root fs.FS) (float64, func() time.Duration) {
	type stat struct{ file, key string }
	var stats []stat
	noting := func(read func(fs.FS, string) (float64, bool), key string) func(fs.FS, string) (float64, bool) {
		return func(r fs.FS, dir string) (float64, bool) {
			v, ok := read(r, dir)
			if ok {
				stats = append(stats, stat{path.Join(dir, "cpu.stat"), key})
			}
			return v, ok
		}
	}
	cpus, ok := limit(root, "cpu", noting(readV1, "throttled_time"), noting(readV2, "throttled_usec"))
	if !ok {
		return 0, nil
	}
	return cpus, func() time.Duration {
		var sum time.Duration
		for _, st := range stats {
			b, err := fs.ReadFile(root, st.file)
			if err != nil {
				continue
			}
			for line := range strings.Lines(string(b)) {
				k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
				if k != st.key {
					continue
				}
				if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
					if st.key == "throttled_usec" {
						n *= 1000
					}
					sum += time.Duration(n)
				}
			}
		}
		return sum
	}
}

// limit is the smallest limit that v1 (in controller's hierarchy) or v2
// reads along this process's cgroup and its ancestors.
func limit(root fs.FS, controller string, readV1, readV2 func(fs.FS, string) (float64, bool)) (float64, bool) {
	cg, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	mounts, err := fs.ReadFile(root, "proc/self/mountinfo")
	if err != nil {
		return 0, false
	}
	var v1, v2 string // the process's cgroup in each hierarchy
	haveV1, haveV2 := false, false
	sc := bufio.NewScanner(bytes.NewReader(cg))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2, haveV2 = f[2], true
		} else if hasField(f[1], ",", controller) {
			v1, haveV1 = f[2], true
		}
	}
	best, found := math.Inf(1), false
	sc = bufio.NewScanner(bytes.NewReader(mounts))
	for sc.Scan() {
		// id parent major:minor root mount-point options... - fstype source super-options
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+3 >= len(f) {
			continue
		}
		mroot, point, fstype, opts := f[3], f[4], f[sep+1], f[sep+3]
		var v float64
		var ok bool
		switch {
		case fstype == "cgroup2" && haveV2:
			v, ok = walkLimit(root, point, mroot, v2, readV2)
		case fstype == "cgroup" && haveV1 && hasField(opts, ",", controller):
			v, ok = walkLimit(root, point, mroot, v1, readV1)
		}
		if ok && v < best {
			best, found = v, true
		}
	}
	return best, found
}

// walkLimit reads the limit of cgroup cg and of each of its ancestors
// visible under the mount point (whose root is mroot in the hierarchy) and
// returns the smallest.
func walkLimit(root fs.FS, point, mroot, cg string, read func(fs.FS, string) (float64, bool)) (float64, bool) {
	rel, ok := strings.CutPrefix(path.Clean(cg), path.Clean(mroot))
	if !ok {
		return 0, false
	}
	dir := path.Join(strings.TrimPrefix(point, "/"), rel)
	top := path.Clean(strings.TrimPrefix(point, "/"))
	best, found := math.Inf(1), false
	for {
		if v, ok := read(root, dir); ok && v < best {
			best, found = v, true
		}
		if dir == top || dir == "." || dir == "/" {
			return best, found
		}
		dir = path.Dir(dir)
	}
}

// readV2 reads cpu.max: "max 100000" (no limit) or "quota period".
func readV2(root fs.FS, dir string) (float64, bool) {
	b, err := fs.ReadFile(root, path.Join(dir, "cpu.max"))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0, false
	}
	return quotaCPUs(f[0], f[1])
}

// readV1 reads cpu.cfs_quota_us (-1: no limit) and cpu.cfs_period_us.
func readV1(root fs.FS, dir string) (float64, bool) {
	q, err := fs.ReadFile(root, path.Join(dir, "cpu.cfs_quota_us"))
	if err != nil {
		return 0, false
	}
	p, err := fs.ReadFile(root, path.Join(dir, "cpu.cfs_period_us"))
	if err != nil {
		return 0, false
	}
	return quotaCPUs(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

// readMemV2 reads memory.max: "max" (no limit) or bytes.
func readMemV2(root fs.FS, dir string) (float64, bool) {
	return memBytes(root, path.Join(dir, "memory.max"))
}

// readMemV1 reads memory.limit_in_bytes (no limit: a number near 2^63).
func readMemV1(root fs.FS, dir string) (float64, bool) {
	return memBytes(root, path.Join(dir, "memory.limit_in_bytes"))
}

func memBytes(root fs.FS, file string) (float64, bool) {
	b, err := fs.ReadFile(root, file)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 || v >= 1<<62 {
		return 0, false
	}
	return float64(v), true
}

func quotaCPUs(quota, period string) (float64, bool) {
	q, err1 := strconv.ParseInt(quota, 10, 64)
	p, err2 := strconv.ParseInt(period, 10, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0, false
	}
	return float64(q) / float64(p), true
}

// hasField reports whether list, split at sep, contains x.
func hasField(list, sep, x string) bool {
	for f := range strings.SplitSeq(list, sep) {
		if f == x {
			return true
		}
	}
	return false
}
