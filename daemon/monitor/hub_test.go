package monitor

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/servicematch"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fakeSource is a datapath whose events the test hands in (a unit test of the fan-out;
// the real datapath is tested in bpf/lbxdp and integration/).
type fakeSource struct {
	mu      sync.Mutex
	on, fwd bool
	opens   int
	events  chan *lbdv1.MonitorEvent
}

func (s *fakeSource) SetMonitor(on, fwd bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.on, s.fwd = on, fwd
	return nil
}

func (s *fakeSource) state() (on, fwd bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.on, s.fwd
}

func (s *fakeSource) OpenMonitor() (Reader, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opens++
	return &fakeReader{events: s.events, closed: make(chan struct{})}, nil
}

type fakeReader struct {
	events chan *lbdv1.MonitorEvent
	once   sync.Once
	closed chan struct{}
}

func (r *fakeReader) Read() (*lbdv1.MonitorEvent, error) {
	select {
	case ev := <-r.events:
		return ev, nil
	case <-r.closed:
		return nil, ErrClosed
	}
}

func (r *fakeReader) Close() error { r.once.Do(func() { close(r.closed) }); return nil }

func event(reason, verdict, service string) *lbdv1.MonitorEvent {
	return &lbdv1.MonitorEvent{Time: timestamppb.Now(), Reason: reason, Verdict: verdict, ServiceName: service}
}

func next(t *testing.T, l *Listener) Item {
	t.Helper()
	select {
	case it := <-l.Events():
		return it
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	return Item{}
}

// TestHub: the datapath's monitor is on exactly while someone listens (with forwarded
// packets while one listener asks for them); each listener gets what its filter takes;
// a listener that does not read loses events, counted, without holding the others up.
func TestHub(t *testing.T) {
	src := &fakeSource{events: make(chan *lbdv1.MonitorEvent)}
	h := New(src, Options{Backlog: 2, MaxListeners: 2})
	if on, _ := src.state(); on {
		t.Fatal("monitor on without a listener")
	}
	web, err := servicematch.Compile([]string{"web*"})
	if err != nil {
		t.Fatal(err)
	}
	drops, err := h.Listen(Filter{DropsOnly: true, Services: web})
	if err != nil {
		t.Fatal(err)
	}
	if on, fwd := src.state(); !on || fwd {
		t.Fatalf("one listener of drops: on %v forwarded %v", on, fwd)
	}
	all, err := h.Listen(Filter{Forwarded: true})
	if err != nil {
		t.Fatal(err)
	}
	if on, fwd := src.state(); !on || !fwd {
		t.Fatalf("a listener of forwarded packets: on %v forwarded %v", on, fwd)
	}
	if _, err := h.Listen(Filter{}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("a third listener: %v, want ErrTooMany", err)
	}

	src.events <- event("malformed", "XDP_DROP", "web")
	src.events <- event("rejected", "XDP_TX", "web")
	src.events <- event("forwarded", "XDP_TX", "web")
	src.events <- event("no_service", "XDP_DROP", "")
	src.events <- event("fragment", "XDP_DROP", "web2")
	// "drops" reads; once it has the last event, every one has been offered to both.
	for _, want := range []string{"malformed", "fragment"} {
		if it := next(t, drops); it.Event.Reason != want || it.Lost != 0 {
			t.Errorf("drops of web*: %+v, want %s with nothing lost", it, want)
		}
	}
	for _, want := range []string{"malformed", "rejected"} {
		if it := next(t, all); it.Event.Reason != want || it.Lost != 0 {
			t.Errorf("all: %+v, want %s with nothing lost", it, want)
		}
	}
	// The last three found "all" with a full queue: lost, and counted on the next
	// one it gets.
	src.events <- event("too_big", "XDP_TX", "")
	if it := next(t, all); it.Event.Reason != "too_big" || it.Lost != 3 {
		t.Errorf("all, after three events with a full queue: %s lost %d, want too_big after 3 lost", it.Event.Reason, it.Lost)
	}

	all.Close()
	if on, fwd := src.state(); !on || fwd {
		t.Fatalf("the forwarded listener left: on %v forwarded %v", on, fwd)
	}
	if _, ok := <-all.Events(); ok {
		t.Error("a closed listener's queue stays open (or kept an event)")
	}
	drops.Close()
	drops.Close()
	if on, _ := src.state(); on {
		t.Fatal("monitor still on after the last listener left")
	}
	// A new listener opens the datapath's stream again; events from before it started
	// (left in the ring) are not its.
	again, err := h.Listen(Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	old := event("malformed", "XDP_DROP", "")
	old.Time = timestamppb.New(time.Now().Add(-time.Minute))
	src.events <- old
	src.events <- event("no_service", "XDP_DROP", "")
	if it := next(t, again); it.Event.Reason != "no_service" {
		t.Errorf("a new listener got %s first, want the event after it started", it.Event.Reason)
	}
	if src.opens != 2 {
		t.Errorf("the stream was opened %d times, want 2", src.opens)
	}
}

// TestDropsOnly: drops are the XDP program's and the backend node's TC programs'.
func TestDropsOnly(t *testing.T) {
	f := Filter{DropsOnly: true}
	for _, c := range []struct {
		reason, verdict string
		want            bool
	}{
		{"malformed", "XDP_DROP", true},
		{"backend_drop_bad_geneve", "TCX_DROP", true},
		{"rejected", "XDP_TX", false},
		{"needs_neighbour", "XDP_PASS", false},
	} {
		if got := f.match(event(c.reason, c.verdict, "")); got != c.want {
			t.Errorf("%s %s: drops-only takes it %v, want %v", c.reason, c.verdict, got, c.want)
		}
	}
}
