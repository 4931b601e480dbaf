package actors

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/core"
)

// failingLinks measures every link except those touching node bad, and
// records the links it was asked for.
type failingLinks struct {
	bad   string
	asked [][2]string
}

func (f *failingLinks) MeasureLink(_ context.Context, from, to job.NodeInfo, _ time.Duration) (core.LinkMeasure, error) {
	f.asked = append(f.asked, [2]string{from.Name, to.Name})
	if from.Name == f.bad || to.Name == f.bad {
		return core.LinkMeasure{}, errors.New("dial: i/o timeout")
	}
	return core.LinkMeasure{From: from.Name, To: to.Name, BytesPerSec: 1e9}, nil
}

// A probe round that fails on a link skips the other links of its two
// nodes, and measures the rest.
func TestMeasureLinksSkipsTheNodesOfAFailedLink(t *testing.T) {
	links := &failingLinks{bad: "c"}
	live := []job.NodeInfo{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
	pairs := [][2]string{{"a", "b"}, {"a", "c"}, {"c", "a"}, {"c", "b"}, {"b", "d"}, {"a", "d"}, {"d", "b"}}
	got := measureLinks(context.Background(), links, slog.New(slog.DiscardHandler), live, pairs, 0)
	wantAsked := [][2]string{{"a", "b"}, {"a", "c"}, {"b", "d"}, {"d", "b"}}
	if !slices.Equal(links.asked, wantAsked) {
		t.Errorf("asked for %v, want %v", links.asked, wantAsked)
	}
	var measured [][2]string
	for _, m := range got {
		measured = append(measured, [2]string{m.From, m.To})
	}
	if want := [][2]string{{"a", "b"}, {"b", "d"}, {"d", "b"}}; !slices.Equal(measured, want) {
		t.Errorf("measured %v, want %v", measured, want)
	}
}
