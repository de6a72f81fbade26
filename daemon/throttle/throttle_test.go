package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/authz"
	"github.com/lbd-dev/lbd/daemon/peercred"
	"google.golang.org/grpc/peer"
)

func asUID(uid uint32) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: peercred.AuthInfo{Creds: peercred.Creds{UID: uid, GIDs: []uint32{uid}}}})
}

// TestRatePerPrincipal: a principal above its rate is refused, after the refusal delay,
// with an error IsLimited recognizes; another principal keeps its own budget; an exempt
// one has none.
func TestRatePerPrincipal(t *testing.T) {
	l := New(Options{Rate: 1, Burst: 2, Exempt: func(id authz.Identity) bool { return id.UID == 0 }})
	for i := range 2 {
		if err := l.allow(asUID(1000)); err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	start := time.Now()
	err := l.allow(asUID(1000))
	if !IsLimited(err) {
		t.Fatalf("third call at once: %v, want a rate-limit refusal", err)
	}
	if d := time.Since(start); d < RefusalDelay {
		t.Errorf("refused after %v, want at least %v", d, RefusalDelay)
	}
	if err := l.allow(asUID(1001)); err != nil {
		t.Errorf("another principal: %v", err)
	}
	for i := range 50 {
		if err := l.allow(asUID(0)); err != nil {
			t.Fatalf("exempt principal, call %d: %v", i, err)
		}
	}
}
