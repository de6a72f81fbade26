package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/authz"
	"github.com/lbd-dev/lbd/daemon/peercred"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"
)

// asUID is a call's context from a socket peer with uid; cancel ends the call.
func asUID(uid uint32) (ctx context.Context, cancel func()) {
	return context.WithCancel(peer.NewContext(context.Background(), &peer.Peer{AuthInfo: peercred.AuthInfo{Creds: peercred.Creds{UID: uid, GIDs: []uint32{uid}}}}))
}

// open starts a call of uid through the tap handle; the call stays open until the test
// ends.
func open(t *testing.T, l *Limiter, uid uint32) (cancel func(), err error) {
	return openMethod(t, l, uid, "/lbd.v1.LoadBalancerService/GetService")
}

func openMethod(t *testing.T, l *Limiter, uid uint32, method string) (cancel func(), err error) {
	ctx, cancel := asUID(uid)
	t.Cleanup(cancel)
	_, err = l.TapHandle(ctx, &tap.Info{FullMethodName: method})
	return cancel, err
}

// TestRatePerPrincipal: a principal above its rate is refused, after the refusal delay,
// with an error IsLimited recognizes; another principal keeps its own budget; an exempt
// one has none.
func TestRatePerPrincipal(t *testing.T) {
	l := New(Options{Rate: 1, Burst: 2, Exempt: func(id authz.Identity) bool { return id.UID == 0 }})
	for i := range 2 {
		if _, err := open(t, l, 1000); err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	start := time.Now()
	_, err := open(t, l, 1000)
	if !IsLimited(err) {
		t.Fatalf("third call at once: %v, want a rate-limit refusal", err)
	}
	if d := time.Since(start); d < RefusalDelay {
		t.Errorf("refused after %v, want at least %v", d, RefusalDelay)
	}
	if _, err := open(t, l, 1001); err != nil {
		t.Errorf("another principal: %v", err)
	}
	for i := range 50 {
		if _, err := open(t, l, 0); err != nil {
			t.Fatalf("exempt principal, call %d: %v", i, err)
		}
	}
}

// TestOpenCallsPerPrincipal: a principal with MaxOpen calls open is refused another
// until one of them ends; another principal is not.
func TestOpenCallsPerPrincipal(t *testing.T) {
	l := New(Options{MaxOpen: 3})
	var ends []func()
	for i := range 3 {
		end, err := open(t, l, 1000)
		if err != nil {
			t.Fatalf("call %d of 3: %v", i, err)
		}
		ends = append(ends, end)
	}
	if _, err := open(t, l, 1000); !IsLimited(err) {
		t.Fatalf("a fourth call while three are open: %v, want a refusal", err)
	}
	if _, err := open(t, l, 1001); err != nil {
		t.Errorf("another principal: %v", err)
	}
	ends[0]()
	// The count falls when the ended call's context is done, which runs apart.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := open(t, l, 1000)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a call after one of three ended: %v", err)
		}
	}
	if _, err := open(t, l, 1000); !IsLimited(err) {
		t.Fatalf("a call while three are open again: %v, want a refusal", err)
	}
}

// TestStreamsPerPrincipal: a principal with MaxStreams streams open is refused another,
// not a unary call, until one of its streams ends.
func TestStreamsPerPrincipal(t *testing.T) {
	const watch = "/lbd.v1.LoadBalancerService/WatchServices"
	l := New(Options{MaxOpen: 10, MaxStreams: 2, IsStream: func(m string) bool { return m == watch }})
	var ends []func()
	for i := range 2 {
		end, err := openMethod(t, l, 1000, watch)
		if err != nil {
			t.Fatalf("stream %d of 2: %v", i, err)
		}
		ends = append(ends, end)
	}
	if _, err := openMethod(t, l, 1000, watch); !IsLimited(err) {
		t.Fatalf("a third stream while two are open: %v, want a refusal", err)
	}
	if _, err := open(t, l, 1000); err != nil {
		t.Fatalf("a unary call while two streams are open: %v", err)
	}
	ends[1]()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := openMethod(t, l, 1000, watch)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a stream after one of two ended: %v", err)
		}
	}
}
