package clock

import (
	"testing"
	"time"
)

func TestFakeTimersFireInOrderWhenReached(t *testing.T) {
	start := time.Unix(1000, 0)
	f := NewFake(start)
	a, b := f.NewTimer(2*time.Second), f.NewTimer(time.Second)
	stopped := f.NewTimer(time.Second)
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop reports whether it stopped the timer")
	}
	f.Advance(999 * time.Millisecond)
	select {
	case <-a.C():
		t.Fatal("fired early")
	case <-b.C():
		t.Fatal("fired early")
	default:
	}
	if f.Timers() != 2 {
		t.Fatalf("%d timers pending, want 2", f.Timers())
	}
	f.Advance(time.Millisecond)
	if got := <-b.C(); !got.Equal(start.Add(time.Second)) {
		t.Fatalf("b fired at %v", got)
	}
	f.Set(start.Add(time.Hour))
	if got := <-a.C(); !got.Equal(start.Add(2 * time.Second)) {
		t.Fatalf("a fired at %v", got)
	}
	if !f.Now().Equal(start.Add(time.Hour)) || b.Stop() {
		t.Fatal("a fired timer cannot be stopped; Set moves the time")
	}
	select {
	case <-f.NewTimer(0).C():
	default:
		t.Fatal("a timer of 0 fires at once")
	}
	set := make(chan Timer)
	go func() { set <- f.NewTimer(time.Minute) }()
	f.BlockUntil(1)
	f.Advance(time.Minute)
	<-(<-set).C()
}
