package cluster

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// decode is decodeMeta without the leaving mark.
func decode(b []byte) (Meta, error) {
	m, _, err := decodeMeta(b)
	return m, err
}

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []Meta{
		{},
		testMeta(0),
		{ActorAddr: "[::1]:8090", Version: "v1.2.3", Profile: Profile{GEMMGFLOPS: 1e-300, MemoryBytes: math.MaxUint64, Threads: 64}},
		{Tags: map[string]string{"ключ": "значение \"quoted\" \x00"}},
	} {
		b, err := EncodeMeta(m)
		if err != nil {
			t.Fatalf("EncodeMeta(%+v): %v", m, err)
		}
		got, err := decode(b)
		if err != nil {
			t.Fatalf("decodeMeta(%q): %v", b, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip of %+v gave %+v", m, got)
		}
	}
	b, _ := EncodeMeta(testMeta(0))
	t.Logf("a typical metadata is %d bytes: %q", len(b), b)
}

func TestMetaSizeLimit(t *testing.T) {
	// {"v":"..."} after the format byte: 9 bytes around the version;
	// EncodeMeta keeps 9 more free for the leaving mark.
	limit := MaxMetaSize - leavingMark
	fits := Meta{Version: strings.Repeat("v", limit-9)}
	b, err := EncodeMeta(fits)
	if err != nil || len(b) != limit {
		t.Fatalf("EncodeMeta of exactly %d bytes: %d bytes, %v", limit, len(b), err)
	}
	over := Meta{Version: strings.Repeat("v", limit-8)}
	if _, err := EncodeMeta(over); !errors.Is(err, ErrMetaTooLarge) {
		t.Errorf("EncodeMeta of %d bytes: %v, want ErrMetaTooLarge", limit+1, err)
	}
	// With the mark, the largest metadata is exactly MaxMetaSize.
	marked, err := encodeMeta(fits, true)
	if err != nil || len(marked) != MaxMetaSize {
		t.Fatalf("leaving mark on the largest metadata: %d bytes, %v", len(marked), err)
	}
	if m, leaving, err := decodeMeta(marked); err != nil || !leaving || !reflect.DeepEqual(m, fits) {
		t.Errorf("decodeMeta of marked metadata: %v, %v", leaving, err)
	}
	if _, err := decode(append(marked, ' ')); !errors.Is(err, ErrBadMeta) {
		t.Errorf("decodeMeta of %d bytes: %v, want ErrBadMeta", MaxMetaSize+1, err)
	}
}

func TestDecodeMetaRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"format", "\x02{}"},
		{"not json", "\x01{"},
		{"trailing", "\x01{} x"},
		{"wrong type", "\x01{\"t\":\"two\"}"},
		{"negative threads", "\x01{\"t\":-1}"},
		{"negative gflops", "\x01{\"g\":-1}"},
		{"huge gflops", "\x01{\"g\":1e999}"},
		{"actor addr", "\x01{\"a\":\"nohost\"}"},
	} {
		if m, err := decode([]byte(tc.in)); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: decodeMeta(%q) = %+v, %v; want ErrBadMeta", tc.name, tc.in, m, err)
		}
	}
	// Unknown keys are ignored: a newer node may add some.
	m, err := decode([]byte("\x01{\"v\":\"9\",\"new\":[1,2]}"))
	if err != nil || m.Version != "9" {
		t.Errorf("decodeMeta with an unknown key: %+v, %v", m, err)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	for i := range 3 {
		b, _ := EncodeMeta(testMeta(i))
		f.Add(b)
	}
	f.Add([]byte("\x01{\"x\":{}}"))
	f.Add([]byte("\x01{\"g\":-0}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadMeta) {
				t.Fatalf("error %v does not wrap ErrBadMeta", err)
			}
			return
		}
		enc, err := EncodeMeta(m)
		if errors.Is(err, ErrMetaTooLarge) {
			return // decoding accepts up to MaxMetaSize; encoding keeps room for the mark
		}
		if err != nil {
			t.Fatalf("decoded %+v but cannot encode it: %v", m, err)
		}
		m2, err := decode(enc)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: %+v -> %q -> %+v, %v", m, enc, m2, err)
		}
	})
}

func TestParseKey(t *testing.T) {
	raw := make([]byte, 32) // neither hex nor base64
	for i := range raw {
		raw[i] = byte(0x80 + i)
	}
	k16 := bytes.Repeat([]byte{0xab}, 16)
	k24 := bytes.Repeat([]byte{0x5c}, 24)
	k32 := bytes.Repeat([]byte{0xff}, 32)
	for _, tc := range []struct {
		name string
		in   []byte
		want []byte
	}{
		{"raw 32", raw, raw},
		{"raw 16 with a newline byte", append(bytes.Repeat([]byte{0}, 15), '\n'), append(bytes.Repeat([]byte{0}, 15), '\n')},
		{"hex 16", []byte(hex.EncodeToString(k16) + "\n"), k16},
		{"hex 32", []byte(hex.EncodeToString(k32)), k32},
		{"base64 24", []byte("  " + base64.StdEncoding.EncodeToString(k24) + "\n"), k24},
		{"base64 32", []byte(base64.StdEncoding.EncodeToString(k32) + "\r\n"), k32},
	} {
		got, err := ParseKey(tc.in)
		if err != nil || !bytes.Equal(got, tc.want) {
			t.Errorf("%s: ParseKey = %x, %v; want %x", tc.name, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "short", hex.EncodeToString(make([]byte, 20)), base64.StdEncoding.EncodeToString(make([]byte, 8))} {
		if _, err := ParseKey([]byte(in)); !errors.Is(err, ErrBadKey) {
			t.Errorf("ParseKey(%q): %v, want ErrBadKey", in, err)
		}
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	k := bytes.Repeat([]byte{3}, 32)
	path := filepath.Join(dir, "key")
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(k)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadKeyFile(path)
	if err != nil || !bytes.Equal(got, k) {
		t.Errorf("ReadKeyFile = %x, %v", got, err)
	}
	if _, err := ReadKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	_ = os.WriteFile(bad, []byte("nope\n"), 0o600)
	if _, err := ReadKeyFile(bad); !errors.Is(err, ErrBadKey) || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad file: %v, want ErrBadKey naming the file", err)
	}
}

func TestEventQueueOrderAndCoalescing(t *testing.T) {
	q := newEventQueue()
	ev := func(k EventKind, name, version string) Event {
		return Event{Kind: k, Member: Member{Name: name, Meta: Meta{Version: version}}}
	}
	for _, e := range []Event{
		ev(EventJoin, "a", "1"),
		ev(EventJoin, "b", "1"),
		ev(EventUpdate, "a", "2"), // folds into a's join
		ev(EventUpdate, "b", "2"), // folds into b's join
		ev(EventLeave, "a", "2"),
		ev(EventUpdate, "b", "3"), // folds into b's join still
		ev(EventJoin, "a", "4"),   // after a leave: kept
		ev(EventUpdate, "a", "5"), // folds into a's second join
		ev(EventFailed, "b", "3"),
		ev(EventUpdate, "b", "6"), // after a failure: kept (cannot fold)
	} {
		q.push(e)
	}
	want := []Event{
		ev(EventJoin, "a", "2"),
		ev(EventJoin, "b", "3"),
		ev(EventLeave, "a", "2"),
		ev(EventJoin, "a", "5"),
		ev(EventFailed, "b", "3"),
		ev(EventUpdate, "b", "6"),
	}
	var got []Event
	for {
		e, ok := q.pop()
		if !ok {
			break
		}
		got = append(got, e)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("queue gave\n%v\nwant\n%v", got, want)
	}
	q.close()
	q.push(ev(EventJoin, "c", ""))
	if q.len() != 0 {
		t.Error("push after close queued an event")
	}
}

// capture is a slog.Handler that keeps records.
type capture struct {
	mu   sync.Mutex // guards recs
	recs []slog.Record
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	c.recs = append(c.recs, r)
	c.mu.Unlock()
	return nil
}
func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

func TestLogLevelsMapToSlog(t *testing.T) {
	h := &capture{}
	std := newStdLogger(slog.New(h))
	std.Printf("[DEBUG] memberlist: d %d", 1)
	std.Printf("[INFO] memberlist: i")
	std.Printf("[WARN] memberlist: w")
	std.Printf("[ERR] memberlist: e")
	std.Printf("Err: no tag")
	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelDebug, "d 1"}, {slog.LevelInfo, "i"}, {slog.LevelWarn, "w"}, {slog.LevelError, "e"}, {slog.LevelInfo, "Err: no tag"},
	}
	if len(h.recs) != len(want) {
		t.Fatalf("%d records, want %d", len(h.recs), len(want))
	}
	for i, w := range want {
		if r := h.recs[i]; r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d: %v %q, want %v %q", i, r.Level, r.Message, w.level, w.msg)
		}
	}

	// A running node logs memberlist's lines through the handler, at
	// memberlist's level: a join is logged at debug on both sides.
	h2 := &capture{}
	a := start(t, "a", testMeta(0), func(c *Config) { c.Logger = slog.New(h2) })
	b := start(t, "b", testMeta(1), nil, a.Addr())
	awaitMembers(t, a, converge, "seeing b", hasNames("a", "b"))
	_ = b.Close()
	_ = a.Close()
	h2.mu.Lock()
	defer h2.mu.Unlock()
	var debug int
	for _, r := range h2.recs {
		r.Attrs(func(at slog.Attr) bool {
			if at.Key == "src" && at.Value.String() == "memberlist" && r.Level == slog.LevelDebug {
				debug++
			}
			return true
		})
	}
	if debug == 0 {
		t.Errorf("no memberlist debug lines among %d records", len(h2.recs))
	}
}

func TestDefaultConfig(t *testing.T) {
	c := Config{Name: "n"}.withDefaults()
	if c.ProbeInterval != 200*time.Millisecond || c.ProbeTimeout != 100*time.Millisecond ||
		c.SuspicionMult != 2 || c.GossipInterval != 50*time.Millisecond || c.BindAddr != "127.0.0.1:0" {
		t.Errorf("defaults %+v", c)
	}
	// Fields set by the caller are kept.
	c = Config{Name: "n", ProbeInterval: time.Second, ProbeTimeout: 300 * time.Millisecond}.withDefaults()
	if c.ProbeInterval != time.Second || c.ProbeTimeout != 300*time.Millisecond || c.SuspicionMult != 2 {
		t.Errorf("withDefaults overrode the caller: %+v", c)
	}
	if err := c.validate(); err != nil {
		t.Error(err)
	}
}
