package tensorio_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

var (
	realTable  = flag.Bool("real-table", false, "measure the codecs on testdata/real, print the tables of BENCHMARKS.md and rewrite testdata/real/speeds.json (run with -cpu=1)")
	realRounds = flag.Int("real-rounds", 9, "with -real-table: timed rounds per measurement (the fastest counts)")
)

const speedsFile = "speeds.json"

// Links of the acceptance test, in bytes per second.
var realLinks = []struct {
	name string
	bps  float64
}{
	{"100 Mbit/s", 100e6 / 8},
	{"10 Gbit/s", 10e9 / 8},
}

// speedRecord is testdata/real/speeds.json: the codecs measured on each
// recorded sample by TestRealCodecTable.
type speedRecord struct {
	Command string         `json:"command"`
	Machine string         `json:"machine"`
	Go      string         `json:"go"`
	Samples []sampleRecord `json:"samples"`
}

type sampleRecord struct {
	Name     string                 `json:"name"`
	Shape    []int                  `json:"shape"`
	RawBytes int                    `json:"raw_bytes"`
	Zeros    float64                `json:"zeros"` // fraction of +0 elements
	CopyBps  float64                `json:"copy_bytes_per_sec"`
	Codecs   map[string]codecRecord `json:"codecs"`
}

type codecRecord struct {
	FrameBytes int     `json:"frame_bytes"`
	EncodeBps  float64 `json:"encode_bytes_per_sec"` // raw bytes per second
	DecodeBps  float64 `json:"decode_bytes_per_sec"`
}

// seconds is the end-to-end time of one frame: encode, transfer, decode.
func (s sampleRecord) seconds(c codecRecord, link float64) float64 {
	raw := float64(s.RawBytes)
	return raw/c.EncodeBps + float64(c.FrameBytes)/link + raw/c.DecodeBps
}

// fastest returns the lossless codec with the smallest end-to-end time.
func (s sampleRecord) fastest(link float64) tensorio.Codec {
	best, bestT := tensorio.CodecRaw, math.Inf(1)
	for _, c := range tensorio.Codecs() {
		r, ok := s.Codecs[c.String()]
		if ok && c.Lossless() && s.seconds(r, link) < bestT {
			best, bestT = c, s.seconds(r, link)
		}
	}
	return best
}

// table returns the sample's speeds as a SpeedTable.
func (s sampleRecord) table() tensorio.SpeedTable {
	st := tensorio.SpeedTable{}
	for name, r := range s.Codecs {
		c, err := tensorio.ParseCodec(name)
		if err == nil {
			st[c] = tensorio.CodecSpeed{Encode: r.EncodeBps, Decode: r.DecodeBps}
		}
	}
	return st
}

func zeroFraction(x []float32) float64 {
	z := 0
	for _, v := range x {
		if math.Float32bits(v) == 0 {
			z++
		}
	}
	return float64(z) / float64(max(len(x), 1))
}

func f32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

// bestTime runs f in rounds of about a millisecond and returns the time
// of one call in the fastest round: on a shared machine the minimum is
// the figure that other load disturbs least.
func bestTime(rounds int, f func()) time.Duration {
	f() // warm up
	n := 1
	for {
		t0 := time.Now()
		for range n {
			f()
		}
		if time.Since(t0) > time.Millisecond || n >= 1<<20 {
			break
		}
		n *= 2
	}
	best := time.Duration(math.MaxInt64)
	for range rounds {
		t0 := time.Now()
		for range n {
			f()
		}
		best = min(best, time.Since(t0)/time.Duration(n))
	}
	return best
}

// bestTimes is bestTime for several functions, their rounds interleaved
// so that load on the machine affects them alike. Each round runs its
// function once untimed first, so that every function is timed with its
// own data in the caches, not with what the one before it left there.
func bestTimes(rounds int, fs ...func()) []time.Duration {
	reps := make([]int, len(fs))
	for i, f := range fs {
		f()
		n := 1
		for {
			t0 := time.Now()
			for range n {
				f()
			}
			if time.Since(t0) > time.Millisecond || n >= 1<<20 {
				break
			}
			n *= 2
		}
		reps[i] = n
	}
	best := make([]time.Duration, len(fs))
	for i := range best {
		best[i] = time.Duration(math.MaxInt64)
	}
	for range rounds {
		for i, f := range fs {
			f()
			t0 := time.Now()
			for range reps[i] {
				f()
			}
			best[i] = min(best[i], time.Since(t0)/time.Duration(reps[i]))
		}
	}
	return best
}

// TestRealCodecTable measures every codec on every recorded sample (one
// goroutine), prints the tables of BENCHMARKS.md and rewrites
// testdata/real/speeds.json:
//
//	go test ./tensorio/ -run TestRealCodecTable -real-table -cpu=1 -v
func TestRealCodecTable(t *testing.T) {
	if !*realTable {
		t.Skip("run with -real-table -cpu=1 to measure and record")
	}
	rec := speedRecord{
		Command: "go test ./tensorio/ -run TestRealCodecTable -real-table -cpu=1 -v",
		Machine: machine(), Go: runtime.Version(),
	}
	for _, s := range loadRealSamples(t) {
		x := nn.F32(s.t)
		raw := 4 * len(x)
		sr := sampleRecord{Name: s.name, Shape: s.t.Shape(), RawBytes: raw, Zeros: zeroFraction(x), Codecs: map[string]codecRecord{}}
		buf := make([]byte, raw)
		sr.CopyBps = float64(raw) / bestTime(*realRounds, func() { copy(buf, f32Bytes(x)) }).Seconds()
		for _, c := range tensorio.Codecs() {
			frame, err := tensorio.AppendFrame(nil, s.t, c)
			if err != nil {
				t.Fatal(err)
			}
			enc := make([]byte, 0, len(frame))
			dst := nn.New(s.t.Shape()...)
			te := bestTime(*realRounds, func() { enc, _ = tensorio.AppendFrame(enc[:0], s.t, c) })
			td := bestTime(*realRounds, func() {
				if _, _, err := tensorio.DecodeFrame(frame, dst); err != nil {
					t.Fatal(err)
				}
			})
			sr.Codecs[c.String()] = codecRecord{
				FrameBytes: len(frame),
				EncodeBps:  float64(raw) / te.Seconds(),
				DecodeBps:  float64(raw) / td.Seconds(),
			}
		}
		rec.Samples = append(rec.Samples, sr)
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(realDir, speedsFile), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Print(codecTable(rec), "\n", chooseTable(t, rec), "\n", rawFramingTable(t))
}

// machine describes the CPU, for the record.
func machine() string {
	cpu := runtime.GOARCH
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, %s/%s", cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
}

// sampleClasses group the samples in the tables.
var sampleClasses = []struct {
	name  string
	match func(name string) bool
}{
	{"mlp32 ReLU activations (act/relu8, act/relu24)", func(n string) bool {
		return strings.HasPrefix(n, "mlp32/act/relu")
	}},
	{"resnet50 block outputs, after add+ReLU (act/layer*)", func(n string) bool {
		return strings.HasPrefix(n, "resnet50/act/")
	}},
	{"mlp32 gradient at a pre-ReLU cut (grad/fc16)", func(n string) bool {
		return n == "mlp32/grad/fc16"
	}},
	{"dense: mlp32 act/fc16 and every other gradient", func(n string) bool {
		return n == "mlp32/act/fc16" || strings.Contains(n, "/grad/") && n != "mlp32/grad/fc16"
	}},
}

// codecTable is the per-class table: ratio (raw bytes / frame bytes) and
// throughput in MB/s of raw data, totals over the class's samples.
func codecTable(rec speedRecord) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| samples | zeros | codec | ratio | encode MB/s | decode MB/s |\n|---|---:|---|---:|---:|---:|\n")
	for _, cl := range sampleClasses {
		var ss []sampleRecord
		for _, s := range rec.Samples {
			if cl.match(s.Name) {
				ss = append(ss, s)
			}
		}
		if len(ss) == 0 {
			continue
		}
		raw, zeros := 0.0, 0.0
		for _, s := range ss {
			raw += float64(s.RawBytes)
			zeros += s.Zeros * float64(s.RawBytes)
		}
		for i, c := range tensorio.Codecs() {
			var frame, te, td float64
			for _, s := range ss {
				r := s.Codecs[c.String()]
				frame += float64(r.FrameBytes)
				te += float64(s.RawBytes) / r.EncodeBps
				td += float64(s.RawBytes) / r.DecodeBps
			}
			label, z := "", ""
			if i == 0 {
				label, z = cl.name, fmt.Sprintf("%.0f%%", 100*zeros/raw)
			}
			name := c.String()
			if !c.Lossless() {
				name += " (lossy)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %.0f | %.0f |\n", label, z, name, raw/frame, raw/te/1e6, raw/td/1e6)
		}
	}
	return b.String()
}

// chooseTable lists, per sample and link, the fastest codec end to end by
// the measurements and the codec Choose picks with the sample's measured
// speeds.
func chooseTable(t *testing.T, rec speedRecord) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| sample | %s fastest | Choose | %s fastest | Choose |\n|---|---|---|---|---|\n", realLinks[0].name, realLinks[1].name)
	samples := loadRealSamples(t)
	for i, s := range rec.Samples {
		fmt.Fprintf(&b, "| %s ", s.Name)
		for _, l := range realLinks {
			fmt.Fprintf(&b, "| %v | %v ", s.fastest(l.bps), s.table().Choose(nn.F32(samples[i].t), l.bps))
		}
		b.WriteString("|\n")
	}
	return b.String()
}

// rawFramingTable compares raw frames with a plain copy of the tensor's
// bytes, the operation they replace, at the size of a recorded sample and
// at 1, 4 and 16 MiB: AppendFrame with copying the tensor into a reused
// buffer where the frame's payload goes ("copy in"), DecodeFrame with
// copying the payload out of the frame into the tensor ("copy out"), and
// a frame through Writer and Reader over a bytes.Buffer with writing the
// tensor's bytes into it and reading them out ("stream copy"). The
// percentages are the extra time over the copy.
func rawFramingTable(t *testing.T) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| size | copy in GB/s | AppendFrame raw | copy + hash/crc32 | copy out GB/s | DecodeFrame raw | stream copy GB/s | Writer+Reader |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	samples := loadRealSamples(t)
	base := nn.F32(samples[0].t)
	for _, n := range []int{len(base), 1 << 18, 1 << 20, 4 << 20} {
		x := make([]float32, n)
		for i := 0; i < n; i += len(base) {
			copy(x[i:], base)
		}
		ts := nn.FromData(x, n/512, 512)
		src := f32Bytes(x)
		buf := make([]byte, len(src)+64)
		frame, _ := tensorio.AppendFrame(nil, ts, tensorio.CodecRaw)
		dst := nn.New(ts.Shape()...)
		cast := crc32.MakeTable(crc32.Castagnoli)
		var sink bytes.Buffer
		sink.Grow(len(src) + 64)
		out := make([]byte, len(src))
		w, rd := tensorio.NewWriter(&sink, tensorio.CodecRaw), tensorio.NewReader(&sink)
		hl := tensorio.FrameHeaderLen(2)
		dstBytes := f32Bytes(nn.F32(dst))
		ds := bestTimes(3**realRounds,
			func() { copy(buf[hl:], src) },
			func() { buf, _ = tensorio.AppendFrame(buf[:0], ts, tensorio.CodecRaw) },
			func() { tensorio.DecodeFrame(frame, dst) },
			func() { copy(buf[hl:], src); crc32.Checksum(buf[hl:hl+len(src)], cast) },
			func() { sink.Reset(); sink.Write(src); sink.Read(out) },
			func() {
				sink.Reset()
				w.WriteTensor(ts)
				if _, err := rd.ReadTensor(dst); err != nil {
					t.Fatal(err)
				}
			},
			func() { copy(dstBytes, frame[hl:]) })
		tc, te, td, told, tsc, tsf, tco := ds[0], ds[1], ds[2], ds[3], ds[4], ds[5], ds[6]
		rel := func(d time.Duration, base time.Duration) string {
			return fmt.Sprintf("%+.0f%%", 100*(float64(d)/float64(base)-1))
		}
		gbs := func(d time.Duration) float64 { return float64(4*n) / d.Seconds() / 1e9 }
		fmt.Fprintf(&b, "| %d KiB | %.1f | %s | %s | %.1f | %s | %.1f | %s |\n", 4*n>>10,
			gbs(tc), rel(te, tc), rel(told, tc), gbs(tco), rel(td, tco), gbs(tsc), rel(tsf, tsc))
	}
	return b.String()
}

// loadSpeeds reads testdata/real/speeds.json and checks that it describes
// the recorded samples as the codecs encode them today.
func loadSpeeds(t *testing.T) (speedRecord, []realSample) {
	t.Helper()
	if testing.Short() {
		t.Skip("choices over recorded speeds: no concurrency for the race pass to check")
	}
	b, err := os.ReadFile(filepath.Join(realDir, speedsFile))
	if err != nil {
		t.Fatalf("%v (record it with -real-table)", err)
	}
	var rec speedRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	samples := loadRealSamples(t)
	if len(rec.Samples) != len(samples) {
		t.Fatalf("%s has %d samples, testdata/real %d: re-record with -real-table", speedsFile, len(rec.Samples), len(samples))
	}
	for i, s := range rec.Samples {
		if s.Name != samples[i].name || !slices.Equal(s.Shape, samples[i].t.Shape()) {
			t.Fatalf("%s sample %d is %s %v, testdata/real has %s %v", speedsFile, i, s.Name, s.Shape, samples[i].name, samples[i].t.Shape())
		}
		for _, c := range tensorio.Codecs() {
			if _, ok := s.Codecs[c.String()]; !ok && !c.Lossless() {
				continue // Choose never picks it; recorded before it existed
			}
			frame, err := tensorio.AppendFrame(nil, samples[i].t, c)
			if err != nil {
				t.Fatal(err)
			}
			if r, ok := s.Codecs[c.String()]; !ok || r.FrameBytes != len(frame) {
				t.Fatalf("%s: %v now encodes %s in %d bytes, %s says %d: re-record with -real-table",
					s.Name, c, s.Name, len(frame), speedsFile, r.FrameBytes)
			}
		}
	}
	return rec, samples
}

// tie is the relative difference in end-to-end time below which two
// codecs count as equally fast: well below the run-to-run spread of the
// speed measurements (several per cent on this shared machine).
const tie = 0.005

// TestChooseRecorded checks codec choice against measurement: on every
// recorded real sample and for a 100 Mbit/s and a 10 Gbit/s link, Choose, given the
// codec speeds measured on that sample, picks the codec that the
// measurements show fastest end to end (encode + transfer + decode), or
// one that ties with it. Choose estimates the ratio from a subsample; the
// measurement uses the whole tensor.
func TestChooseRecorded(t *testing.T) {
	rec, samples := loadSpeeds(t)
	for i, s := range rec.Samples {
		for _, l := range realLinks {
			want := s.fastest(l.bps)
			got := s.table().Choose(nn.F32(samples[i].t), l.bps)
			tg, tw := s.seconds(s.Codecs[got.String()], l.bps), s.seconds(s.Codecs[want.String()], l.bps)
			switch {
			case got == want:
			case tg <= tw*(1+tie):
				t.Logf("%s on %s: Choose picks %v (%.3f ms), tied with the fastest, %v (%.3f ms)", s.Name, l.name, got, 1e3*tg, want, 1e3*tw)
			default:
				t.Errorf("%s on %s: Choose picks %v (%.3f ms), the fastest is %v (%.3f ms)", s.Name, l.name, got, 1e3*tg, want, 1e3*tw)
			}
		}
	}
}

// TestChooseRecordedTable checks Choose with one speed table for all
// samples (each codec's total throughput over the recorded samples, as a
// node would measure once): it picks the codec that is fastest by that
// table and the sample's own compression ratio. The time lost against
// the per-sample optimum is logged.
func TestChooseRecordedTable(t *testing.T) {
	rec, samples := loadSpeeds(t)
	agg := tensorio.SpeedTable{}
	for _, c := range tensorio.Codecs() {
		var raw, te, td float64
		for _, s := range rec.Samples {
			r := s.Codecs[c.String()]
			raw += float64(s.RawBytes)
			te += float64(s.RawBytes) / r.EncodeBps
			td += float64(s.RawBytes) / r.DecodeBps
		}
		agg[c] = tensorio.CodecSpeed{Encode: raw / te, Decode: raw / td}
	}
	for i, s := range rec.Samples {
		for _, l := range realLinks {
			// The fastest by the aggregate table, with the sample's
			// measured ratio.
			sec := func(c tensorio.Codec) float64 {
				return float64(s.RawBytes)/agg[c].Encode + float64(s.Codecs[c.String()].FrameBytes)/l.bps + float64(s.RawBytes)/agg[c].Decode
			}
			want := tensorio.CodecRaw
			for _, c := range tensorio.Codecs() {
				if c.Lossless() && sec(c) < sec(want) {
					want = c
				}
			}
			got := agg.Choose(nn.F32(samples[i].t), l.bps)
			if got != want && sec(got) > sec(want)*(1+tie) {
				t.Errorf("%s on %s: Choose picks %v, the aggregate table's fastest is %v", s.Name, l.name, got, want)
			}
			best := s.fastest(l.bps)
			t.Logf("%-28s %-10s picks %-12v (%.3f ms), per-sample fastest %-12v (%.3f ms)", s.Name, l.name,
				got, 1e3*s.seconds(s.Codecs[got.String()], l.bps), best, 1e3*s.seconds(s.Codecs[best.String()], l.bps))
		}
	}
}

// BenchmarkReal reports, for every recorded sample and codec, encode and
// decode throughput (MB/s of raw float32 data) and the ratio (raw bytes /
// frame bytes); op=copy is a plain copy of the tensor's bytes:
//
//	go test ./tensorio/ -run '^$' -bench BenchmarkReal -cpu=1 -benchtime=200ms
func BenchmarkReal(b *testing.B) {
	for _, s := range loadRealSamples(b) {
		x := nn.F32(s.t)
		raw := 4 * len(x)
		b.Run(fmt.Sprintf("sample=%s/op=copy", s.name), func(b *testing.B) {
			buf := make([]byte, raw)
			b.SetBytes(int64(raw))
			for b.Loop() {
				copy(buf, f32Bytes(x))
			}
		})
		for _, c := range tensorio.Codecs() {
			frame, err := tensorio.AppendFrame(nil, s.t, c)
			if err != nil {
				b.Fatal(err)
			}
			ratio := float64(raw) / float64(len(frame))
			b.Run(fmt.Sprintf("sample=%s/codec=%s/op=encode", s.name, c), func(b *testing.B) {
				buf := make([]byte, 0, len(frame))
				b.SetBytes(int64(raw))
				for b.Loop() {
					buf, _ = tensorio.AppendFrame(buf[:0], s.t, c)
				}
				b.ReportMetric(ratio, "ratio")
			})
			b.Run(fmt.Sprintf("sample=%s/codec=%s/op=decode", s.name, c), func(b *testing.B) {
				dst := nn.New(s.t.Shape()...)
				b.SetBytes(int64(raw))
				for b.Loop() {
					if _, _, err := tensorio.DecodeFrame(frame, dst); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(ratio, "ratio")
			})
		}
	}
}

// BenchmarkStreamTCP sends 512 KiB over a loopback TCP connection
// (tcpPair): as plain bytes in one write ("raw"); as a 40-byte header and
// the bytes in two writes, read at once ("header+raw") or as a raw frame
// is read, header first ("header+raw/2reads"); and as a raw frame through
// Writer and Reader ("frame", which adds the checksums).
func BenchmarkStreamTCP(b *testing.B) {
	const n = 128 << 10 // floats
	ts, dst := nn.New(n/512, 512), nn.New(n/512, 512)
	src := f32Bytes(nn.F32(ts))
	hdr := make([]byte, tensorio.FrameHeaderLen(2))
	out := make([]byte, len(hdr)+len(src))
	tcp := newTCPPair(b)
	defer tcp.close()
	w, r := tensorio.NewWriter(tcp.bw, tensorio.CodecRaw), tensorio.NewReader(tcp.br)
	writeSplit := func() error {
		if _, err := tcp.bw.Write(hdr); err != nil {
			return err
		}
		_, err := tcp.bw.Write(src)
		return err
	}
	ops := []struct {
		name        string
		read, write func() error
	}{
		{"raw",
			func() error { _, err := io.ReadFull(tcp.br, out[:len(src)]); return err },
			func() error { _, err := tcp.bw.Write(src); return err }},
		{"header+raw",
			func() error { _, err := io.ReadFull(tcp.br, out); return err },
			writeSplit},
		{"header+raw/2reads",
			func() error {
				if _, err := io.ReadFull(tcp.br, out[:len(hdr)]); err != nil {
					return err
				}
				_, err := io.ReadFull(tcp.br, out[len(hdr):])
				return err
			},
			writeSplit},
		{"frame",
			func() error { _, err := r.ReadTensor(dst); return err },
			func() error { return w.WriteTensor(ts) }},
	}
	for _, op := range ops {
		b.Run("op="+op.name, func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				tcp.send(op.read, op.write)
			}
		})
	}
}

// tcpPair is a loopback TCP connection, buffered at both ends as actors'
// data plane buffers its links (64 KiB), with a goroutine reading at the
// far end.
type tcpPair struct {
	t      testing.TB
	c1, c2 net.Conn
	bw     *bufio.Writer
	br     *bufio.Reader
	reads  chan func() error
	done   chan struct{}
}

func newTCPPair(t testing.TB) *tcpPair {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c1, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpPair{t: t, c1: c1, c2: c2, bw: bufio.NewWriterSize(c1, 64<<10), br: bufio.NewReaderSize(c2, 64<<10),
		reads: make(chan func() error), done: make(chan struct{})}
	go func() {
		for read := range p.reads {
			if err := read(); err != nil {
				t.Error(err)
				c2.Close() // and the writer fails rather than blocks
			}
			p.done <- struct{}{}
		}
	}()
	return p
}

// send runs write at the near end and read at the far end, and returns
// when both are done.
func (p *tcpPair) send(read, write func() error) {
	p.reads <- read
	err := write()
	if err == nil {
		err = p.bw.Flush()
	}
	if err != nil {
		p.t.Error(err)
	}
	<-p.done
}

func (p *tcpPair) close() {
	close(p.reads)
	p.c1.Close()
	p.c2.Close()
}
