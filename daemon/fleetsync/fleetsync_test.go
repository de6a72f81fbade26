//go:build linux

package fleetsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/daemon/etcdstore"
	"github.com/lbd-dev/lbd/daemon/store"
	"github.com/lbd-dev/lbd/internal/etcdtest"
	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
)

// The tests run a real three-member etcd cluster on the loopback (internal/etcdtest)
// and real stores; only the datapath is absent.

const prefix = "/t/"

func client(t *testing.T, eps []string) *etcdstore.Client {
	t.Helper()
	cli, err := etcdstore.Open(etcdstore.Options{Endpoints: eps, Prefix: prefix, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// node is a store following the fleet, as lbd runs it.
type node struct {
	st   *store.Store
	sync *Sync
	errc chan error
	stop context.CancelFunc
	log  logBuffer
}

// logBuffer collects a node's logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func startNode(t *testing.T, eps []string, seed uint32, path string) *node {
	t.Helper()
	n := &node{errc: make(chan error, 1)}
	log := hclog.New(&hclog.LoggerOptions{Output: &n.log, Level: hclog.Debug})
	sy := New(Options{Client: client(t, eps), HashSeed: seed, Logger: log})
	st, err := store.Open(store.Options{Path: path, Limits: store.DefaultLimits(), Shared: sy})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.st, n.sync, n.stop = st, sy, cancel
	go func() { n.errc <- sy.Run(ctx, st) }()
	t.Cleanup(func() {
		n.halt()
		st.Close()
	})
	return n
}

// synced waits until the node read the fleet.
func (n *node) synced(t *testing.T) *node {
	t.Helper()
	waitFor(t, "the node reads the fleet", func() error {
		if r := n.st.Stale(); r != "" {
			return errors.New(r)
		}
		return nil
	})
	return n
}

func (n *node) halt() {
	if n.stop != nil {
		n.stop()
		<-n.errc
		n.stop = nil
	}
}

func webService(name, vip string, backends ...string) *lbdv1.Service {
	svc := &lbdv1.Service{Name: name, Vip: vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
	for _, b := range backends {
		svc.Backends = append(svc.Backends, &lbdv1.Backend{Address: b, Port: 8080})
	}
	return svc
}

func waitFor(t *testing.T, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after 30s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// has checks that a store holds a service with the given IDs and backend count.
func has(st *store.Store, want *lbdv1.Service) error {
	got, err := st.GetService(want.Name)
	if err != nil {
		return err
	}
	if got.Id != want.Id || got.Revision != want.Revision || len(got.Backends) != len(want.Backends) {
		return fmt.Errorf("%s: id %d rev %d, %d backends; want id %d rev %d, %d backends", want.Name, got.Id, got.Revision, len(got.Backends), want.Id, want.Revision, len(want.Backends))
	}
	for i := range got.Backends {
		if got.Backends[i].Id != want.Backends[i].Id {
			return fmt.Errorf("%s: backend %d has id %d, want %d", want.Name, i, got.Backends[i].Id, want.Backends[i].Id)
		}
	}
	return nil
}

// TestFollow: a change through one node's store reaches the other's, IDs and revision
// included; the first node of an empty fleet brings its own services; a node whose hash
// seed is not the fleet's stops with ErrSeedMismatch.
func TestFollow(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	// A file-store node's services become the fleet's first state.
	pre, err := store.Open(store.Options{Path: filepath.Join(dir, "a.pb"), Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	old, err := pre.CreateService(webService("old", "203.0.113.1", "198.18.1.1"))
	if err != nil {
		t.Fatal(err)
	}
	pre.Close()
	// A file-store node that joins a fleet takes its services and drops its own.
	preB, err := store.Open(store.Options{Path: filepath.Join(dir, "b.pb"), Limits: store.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := preB.CreateService(webService("mine", "203.0.113.9", "198.18.1.9")); err != nil {
		t.Fatal(err)
	}
	preB.Close()

	a := startNode(t, c.Endpoints(), 7, filepath.Join(dir, "a.pb")).synced(t)
	b := startNode(t, c.Endpoints(), 7, filepath.Join(dir, "b.pb")).synced(t)
	waitFor(t, "b has a's file-store service", func() error { return has(b.st, old) })
	if _, err := b.st.GetService("mine"); store.Code(err) != codes.NotFound {
		t.Errorf("b kept its own service after joining the fleet: %v", err)
	}

	web, err := a.st.CreateService(webService("web", "203.0.113.2", "198.18.1.1", "198.18.1.2"))
	if err != nil {
		t.Fatalf("create through a: %v", err)
	}
	waitFor(t, "b has web", func() error { return has(b.st, web) })
	if err := b.st.DeleteService("old"); err != nil {
		t.Fatalf("delete through b: %v", err)
	}
	waitFor(t, "a lost old", func() error {
		if _, err := a.st.GetService("old"); store.Code(err) != codes.NotFound {
			return fmt.Errorf("old on a: %v", err)
		}
		return nil
	})
	// The ID old released goes to the next service, on whichever node creates it.
	next, err := b.st.CreateService(webService("next", "203.0.113.3", "198.18.1.3"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a has next", func() error { return has(a.st, next) })
	if a.st.Stale() != "" || b.st.Stale() != "" {
		t.Errorf("stale with etcd up: %q, %q", a.st.Stale(), b.st.Stale())
	}

	other := startNode(t, c.Endpoints(), 8, "")
	select {
	case err := <-other.errc:
		other.stop = nil
		if !errors.Is(err, ErrSeedMismatch) {
			t.Fatalf("a node with another seed: %v", err)
		}
		t.Logf("a node with another seed: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("a node with another seed still runs")
	}
}

// TestConflict: a change based on a revision the fleet has moved past is refused
// with ABORTED and writes nothing.
func TestConflict(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	a := startNode(t, c.Endpoints(), 7, "").synced(t)
	if _, err := a.st.CreateService(webService("web", "203.0.113.2", "198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	a.halt() // a's view stays at its own last change

	raw := client(t, c.Endpoints())
	fs, err := raw.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	moved := webService("web", "203.0.113.2", "198.18.1.9")
	moved.Id, moved.Revision, moved.Backends[0].Id = fs.Services[0].Id, fs.Services[0].Revision+1, 2
	if _, err := raw.Commit(context.Background(), fs.HeadRevision, &statev1.FleetHead{HashSeed: 7}, []*lbdv1.Service{moved}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = a.st.CreateService(webService("late", "203.0.113.3", "198.18.1.1"))
	if store.Code(err) != codes.Aborted {
		t.Fatalf("a change from an old revision: %v, want ABORTED", err)
	}
	t.Logf("a change from an old revision: %v", err)
	if _, err := a.st.GetService("late"); store.Code(err) != codes.NotFound {
		t.Errorf("the refused service is in the store: %v", err)
	}
	if fs, _ := raw.Load(context.Background()); len(fs.Services) != 1 {
		t.Errorf("the refused service reached etcd: %v", fs.Services)
	}
}

// TestPartition: a node cut off from etcd keeps its services, says they are stale and
// refuses changes with UNAVAILABLE; meanwhile the others change the fleet and etcd
// compacts the revisions the cut-off node would resume from: back in touch, it reads
// everything again and has the changes. Restarted while etcd is down, a node starts
// from its local copy.
func TestPartition(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	a := startNode(t, c.Endpoints()[:2], 7, "").synced(t)
	// b talks to the third member only: stopping it cuts b off.
	b := startNode(t, c.Endpoints()[2:], 7, filepath.Join(dir, "b.pb")).synced(t)
	web, err := a.st.CreateService(webService("web", "203.0.113.2", "198.18.1.1"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b has web", func() error { return has(b.st, web) })

	c.Members[2].Stop()
	// Had it led, the others elect a new leader before a's writes go through.
	c.WaitHealthy(30 * time.Second)
	waitFor(t, "b says stale", func() error {
		if b.st.Stale() == "" {
			return errors.New("b does not say stale with its member stopped")
		}
		return nil
	})
	t.Logf("b: %s", b.st.Stale())
	if _, err := b.st.CreateService(webService("cut", "203.0.113.4", "198.18.1.1")); store.Code(err) != codes.Unavailable {
		t.Fatalf("a change on a cut-off node: %v, want UNAVAILABLE", err)
	} else {
		t.Logf("a change on a cut-off node: %v", err)
	}
	if err := has(b.st, web); err != nil {
		t.Fatalf("b's services while cut off: %v", err)
	}
	var later []*lbdv1.Service
	for i := range 3 {
		svc, err := a.st.CreateService(webService(fmt.Sprintf("s%d", i), fmt.Sprintf("203.0.113.%d", 10+i), "198.18.1.1"))
		if err != nil {
			t.Fatalf("a change on the connected node: %v", err)
		}
		later = append(later, svc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := c.Client()
	resp, err := cl.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	c.Members[2].Start()
	waitFor(t, "b resynced", func() error {
		for _, svc := range later {
			if err := has(b.st, svc); err != nil {
				return err
			}
		}
		if r := b.st.Stale(); r != "" {
			return errors.New(r)
		}
		return nil
	})
	if !strings.Contains(b.log.String(), "compacted") {
		t.Errorf("b resynced without meeting the compaction:\n%s", b.log.String())
	}

	// Restarted while etcd is down: b starts from its copy.
	b.halt()
	b.st.Close()
	c.StopAll()
	b2 := startNode(t, c.Endpoints()[2:], 7, filepath.Join(dir, "b.pb"))
	for _, svc := range append(later, web) {
		if err := has(b2.st, svc); err != nil {
			t.Fatalf("restarted with etcd down: %v", err)
		}
	}
	if r := b2.st.Stale(); r == "" {
		t.Error("restarted with etcd down, b does not say stale")
	} else {
		t.Logf("restarted with etcd down: %s", r)
	}
	if _, err := b2.st.CreateService(webService("cut", "203.0.113.4", "198.18.1.1")); store.Code(err) != codes.Unavailable {
		t.Fatalf("a change before the first read: %v, want UNAVAILABLE", err)
	}
	c.StartStopped(60 * time.Second)
	waitFor(t, "b in step after etcd came back", func() error {
		if r := b2.st.Stale(); r != "" {
			return errors.New(r)
		}
		return nil
	})
}
