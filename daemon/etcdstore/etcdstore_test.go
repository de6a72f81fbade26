//go:build linux

package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/internal/etcdtest"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The tests run a real three-member etcd cluster on the loopback (internal/etcdtest).

func openClient(t *testing.T, c *etcdtest.Cluster, prefix string) *Client {
	t.Helper()
	cl, err := Open(Options{Endpoints: c.Endpoints(), Prefix: prefix, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func svc(name string, id uint32) *lbdv1.Service {
	return &lbdv1.Service{Name: name, Id: id, Revision: 1, Vip: "203.0.113.1", Port: 80}
}

// TestCommitIsCompareAndSwap: a change based on the current head applies; one based on
// an older head is refused with ErrConflict and writes nothing; of two writers racing
// from the same head exactly one wins.
func TestCommitIsCompareAndSwap(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	a, b := openClient(t, c, "/t/"), openClient(t, c, "/t/")
	ctx := context.Background()
	st, err := a.Load(ctx)
	if err != nil || st.HeadRevision != 0 || len(st.Services) != 0 {
		t.Fatalf("empty fleet: %+v, %v", st, err)
	}
	rev1, err := a.Commit(ctx, 0, &statev1.FleetHead{HashSeed: 7}, []*lbdv1.Service{svc("web", 1)}, nil)
	if err != nil {
		t.Fatalf("first write: %v", err)
	}
	if _, err := b.Commit(ctx, 0, &statev1.FleetHead{HashSeed: 8}, []*lbdv1.Service{svc("other", 1)}, nil); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second first write: %v, want ErrConflict", err)
	}
	st, err = b.Load(ctx)
	if err != nil || st.HeadRevision != rev1 || st.Head.HashSeed != 7 || len(st.Services) != 1 || st.Services[0].Name != "web" {
		t.Fatalf("after the refused write: %+v, %v", st, err)
	}

	// Two writers from the same head, many times over: one wins each round.
	head := rev1
	for round := range 20 {
		var wg sync.WaitGroup
		var revs [2]int64
		var errs [2]error
		for i, cl := range []*Client{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				revs[i], errs[i] = cl.Commit(ctx, head, &statev1.FleetHead{HashSeed: 7}, []*lbdv1.Service{svc(fmt.Sprintf("w%d-%d", round, i), 2)}, nil)
			}()
		}
		wg.Wait()
		won := 0
		for i := range 2 {
			switch {
			case errs[i] == nil:
				won++
				head = revs[i]
			case !errors.Is(errs[i], ErrConflict):
				t.Fatalf("round %d writer %d: %v", round, i, errs[i])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d writers won, want exactly one", round, won)
		}
	}
	st, _ = a.Load(ctx)
	if len(st.Services) != 21 {
		t.Errorf("%d services after 20 rounds, want 21 (one per round and web)", len(st.Services))
	}
}

// TestWatch: a watch delivers each transaction as one change, in order, with deletes
// and the head; from a compacted revision it fails with ErrCompacted.
func TestWatch(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cl := openClient(t, c, "/w/")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r1, err := cl.Commit(ctx, 0, &statev1.FleetHead{}, []*lbdv1.Service{svc("a", 1), svc("b", 2)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan Change, 10)
	done := make(chan error, 1)
	go func() { done <- cl.Watch(ctx, r1, func(ch Change) error { got <- ch; return nil }) }()
	r2, err := cl.Commit(ctx, r1, &statev1.FleetHead{HashSeed: 1}, []*lbdv1.Service{svc("c", 3)}, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	r3, err := cl.Commit(ctx, r2, &statev1.FleetHead{HashSeed: 2}, nil, []string{"b"})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		rev    int64
		puts   int
		delete string
		seed   uint32
	}{{r2, 1, "a", 1}, {r3, 0, "b", 2}} {
		select {
		case ch := <-got:
			if ch.Revision != want.rev || len(ch.Puts) != want.puts || len(ch.Deletes) != 1 || ch.Deletes[0] != want.delete || ch.Head.GetHashSeed() != want.seed {
				t.Errorf("change %d: %+v, want revision %d, %d puts, delete %s, seed %d", i, ch, want.rev, want.puts, want.delete, want.seed)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("change %d not delivered", i)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watch ended with %v, want nil after cancel", err)
	}

	if _, err := c.Client().Compact(context.Background(), r3); err != nil {
		t.Fatal(err)
	}
	err = cl.Watch(context.Background(), r1, func(Change) error { return nil })
	if !errors.Is(err, ErrCompacted) {
		t.Errorf("watch from a compacted revision: %v, want ErrCompacted", err)
	}
}

// TestUnavailable: with every member stopped, reads and writes fail with ErrUnavailable
// within the timeout; once the members are back they succeed again.
func TestUnavailable(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cl := openClient(t, c, "/u/")
	ctx := context.Background()
	rev, err := cl.Commit(ctx, 0, &statev1.FleetHead{}, []*lbdv1.Service{svc("a", 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Members[0].Kill()
	if _, err := cl.Load(ctx); err != nil {
		t.Fatalf("read with one member of three killed: %v", err)
	}
	c.StopAll()
	start := time.Now()
	_, err = cl.Commit(ctx, rev, &statev1.FleetHead{}, []*lbdv1.Service{svc("b", 2)}, nil)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write with every member stopped: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refused write took %v, more than the 3 s timeout allows", d)
	}
	if _, err := cl.Load(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("read with every member stopped: %v, want ErrUnavailable", err)
	}
	c.StartStopped(30 * time.Second)
	if _, err := cl.Commit(ctx, rev, &statev1.FleetHead{}, []*lbdv1.Service{svc("b", 2)}, nil); err != nil {
		t.Errorf("write after the members came back: %v", err)
	}
}

// TestRegistration: a registration appears in every node watch, follows its updates,
// disappears at once when its node stops, and after its lease's TTL when its node just
// vanishes.
func TestRegistration(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	watcher := openClient(t, c, "/r/")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	views := make(chan map[string]*lbdv1.FleetNode, 100)
	go watcher.WatchNodes(ctx, func(n map[string]*lbdv1.FleetNode, _ int64, ok bool) {
		if ok {
			views <- n
		}
	})
	waitView := func(what string, cond func(map[string]*lbdv1.FleetNode) bool, timeout time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		deadline := time.After(timeout)
		for {
			select {
			case v := <-views:
				if cond(v) {
					return time.Since(start)
				}
			case <-deadline:
				t.Fatalf("%s: not seen within %v", what, timeout)
			}
		}
	}

	node := openClient(t, c, "/r/")
	rctx, rcancel := context.WithCancel(ctx)
	updates := make(chan *lbdv1.FleetNode, 1)
	regDone := make(chan struct{})
	go func() {
		defer close(regDone)
		node.KeepRegistered(rctx, "lb1", 2*time.Second, updates)
	}()
	updates <- &lbdv1.FleetNode{Name: "lb1", AppliedRevision: 1}
	waitView("lb1 registered", func(v map[string]*lbdv1.FleetNode) bool { return v["lb1"].GetAppliedRevision() == 1 }, 10*time.Second)
	updates <- &lbdv1.FleetNode{Name: "lb1", AppliedRevision: 2}
	waitView("lb1 updated", func(v map[string]*lbdv1.FleetNode) bool { return v["lb1"].GetAppliedRevision() == 2 }, 10*time.Second)
	// The lease is renewed: still there after several TTLs.
	time.Sleep(5 * time.Second)
	views = drain(views)
	rcancel()
	<-regDone
	waitView("lb1 gone after its stop", func(v map[string]*lbdv1.FleetNode) bool { return v["lb1"] == nil }, 3*time.Second)

	// A node that vanishes without revoking: its client closes under it.
	gone := openClient(t, c, "/r/")
	gctx, gcancel := context.WithCancel(ctx)
	defer gcancel()
	gupdates := make(chan *lbdv1.FleetNode, 1)
	go gone.KeepRegistered(gctx, "lb2", 2*time.Second, gupdates)
	gupdates <- &lbdv1.FleetNode{Name: "lb2"}
	waitView("lb2 registered", func(v map[string]*lbdv1.FleetNode) bool { return v["lb2"] != nil }, 10*time.Second)
	gone.Close()
	d := waitView("lb2 gone after its lease", func(v map[string]*lbdv1.FleetNode) bool { return v["lb2"] == nil }, 15*time.Second)
	t.Logf("a vanished node's registration left the fleet %v after its client closed (lease TTL 2 s)", d)
}

// drain empties a channel of views and returns it.
func drain(ch chan map[string]*lbdv1.FleetNode) chan map[string]*lbdv1.FleetNode {
	for {
		select {
		case <-ch:
		default:
			return ch
		}
	}
}

// TestTLS: with the store.tls files of the members' CA the client reads and writes; a
// CA that did not sign the members' certificates, or a client certificate of another
// CA, is refused, and the error says which.
func TestTLS(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{TLS: true, Members: 1})
	open := func(ca, cert, key string) *Client {
		cl, err := Open(Options{Endpoints: c.Endpoints(), Prefix: "/t/", CAFile: ca, CertFile: cert, KeyFile: key, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	cert, key := c.CA.Issue("lb1")
	if _, err := open(c.CA.File, cert, key).Commit(context.Background(), 0, &statev1.FleetHead{HashSeed: 1}, nil, nil); err != nil {
		t.Fatalf("a client with the members' CA: %v", err)
	}
	other := etcdtest.NewCA(t, t.TempDir(), "other-ca")
	otherCert, otherKey := other.Issue("lb2")
	for _, tc := range []struct {
		name, ca, cert, key, want string
	}{
		{"trusting another CA", other.File, cert, key, "certificate signed by unknown authority"},
		{"a client certificate of another CA", c.CA.File, otherCert, otherKey, "remote error: tls: "},
	} {
		err := open(tc.ca, tc.cert, tc.key).Ping(context.Background())
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrUnavailable saying %q", tc.name, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
}

// TestElectionIsNotUnreachable: while the members that remain after the leader was
// killed elect another one, a request that times out says the cluster has no leader
// (ErrNoLeader: a quorum answers, nothing can change), not that it is unreachable; with
// a quorum lost it is unreachable.
func TestElectionIsNotUnreachable(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cl, err := Open(Options{Endpoints: c.Endpoints(), Prefix: "/t/", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	c.WaitLeader(10 * time.Second).Kill()
	killed := time.Now()
	fails := 0
	for time.Since(killed) < 3*time.Second {
		if err := cl.Ping(context.Background()); err != nil {
			fails++
			if !errors.Is(err, ErrNoLeader) {
				t.Fatalf("%v after the leader was killed: %v, want ErrNoLeader", time.Since(killed).Round(time.Millisecond), err)
			}
		}
	}
	// Followers wait at least an election timeout (1.5 s here) before they elect.
	if fails == 0 {
		t.Fatal("no request failed while the members elected a leader")
	}
	t.Logf("%d requests failed with ErrNoLeader while the members elected a leader", fails)
	// One member left of three: it answers, but is no quorum.
	c.WaitLeader(30 * time.Second).Kill()
	if err := cl.Ping(context.Background()); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNoLeader) {
		t.Fatalf("with one member of three left: %v, want ErrUnavailable, not ErrNoLeader", err)
	}
}
