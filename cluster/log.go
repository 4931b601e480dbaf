package cluster

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
)

// newStdLogger adapts l to the *log.Logger that memberlist takes.
func newStdLogger(l *slog.Logger) *log.Logger {
	return log.New(slogWriter{l}, "", 0)
}

// slogWriter turns memberlist's log lines, "[LEVEL] memberlist: text",
// into slog records at that level. Lines without a level are Info.
type slogWriter struct{ l *slog.Logger }

var _ io.Writer = slogWriter{}

func (w slogWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	if len(line) > 0 && line[0] == '[' {
		if i := bytes.IndexByte(line, ']'); i > 0 {
			level = memberlistLevel(string(line[1:i]))
			line = bytes.TrimSpace(line[i+1:])
		}
	}
	ctx := context.Background()
	if !w.l.Enabled(ctx, level) {
		return len(p), nil
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.l.Log(ctx, level, string(line), "src", "memberlist")
	return len(p), nil
}

func memberlistLevel(s string) slog.Level {
	switch s {
	case "DEBUG", "TRACE":
		return slog.LevelDebug
	case "WARN", "WARNING":
		return slog.LevelWarn
	case "ERR", "ERROR":
		return slog.LevelError
	}
	return slog.LevelInfo
}
