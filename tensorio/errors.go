package tensorio

import (
	"errors"
	"fmt"
)

// ErrCorrupt classifies every error caused by bad input bytes: a truncated,
// oversized, mis-typed or corrupted frame, checkpoint or safetensors file.
// Test for it with errors.Is(err, tensorio.ErrCorrupt).
var ErrCorrupt = errors.New("tensorio: corrupt input")

// ErrNoCheckpoint is returned by [Store.Latest] when a job has no complete
// checkpoint.
var ErrNoCheckpoint = errors.New("tensorio: no complete checkpoint")

// corruptf returns an error that wraps ErrCorrupt and says what is wrong.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// corruptWrap wraps err (for example io.ErrUnexpectedEOF) as corrupt input
// while keeping it visible to errors.Is.
func corruptWrap(err error, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %w", ErrCorrupt, fmt.Sprintf(format, args...), err)
}
