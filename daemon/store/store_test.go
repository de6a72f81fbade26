package store

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

func testService(name, vip string, backends ...string) *lbdv1.Service {
	s := &lbdv1.Service{Name: name, Vip: vip, Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP}
	for _, b := range backends {
		s.Backends = append(s.Backends, &lbdv1.Backend{Address: b, Port: 80})
	}
	return s
}

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(Options{Path: path, Limits: DefaultLimits()})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPersistAndRestoreKeepIDsAndRevisions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.pb")
	s := open(t, path)
	for _, svc := range []*lbdv1.Service{
		testService("a", "203.0.113.1", "198.18.0.1", "198.18.0.2"),
		testService("b", "2001:db8::1", "2001:db8:1::1"),
		testService("c", "203.0.113.3", "198.18.0.3"),
	} {
		if _, err := s.CreateService(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteService("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateBgpPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65000, Password: "pw"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetDrained(true); err != nil {
		t.Fatal(err)
	}
	before := s.ListServices("")
	s.Close()

	r := open(t, path)
	after := r.ListServices("")
	if len(before) != len(after) {
		t.Fatalf("%d services before, %d after", len(before), len(after))
	}
	for i := range before {
		if !proto.Equal(before[i], after[i]) {
			t.Errorf("service %d differs:\n%v\n%v", i, before[i], after[i])
		}
	}
	if !r.Drained() || r.BgpPeers(true)[0].Spec.Password != "pw" {
		t.Errorf("drain flag or peer password lost")
	}
	// IDs freed by "a" are reused, lowest first, and never collide with live ones.
	svc, err := r.CreateService(testService("d", "203.0.113.4", "198.18.0.4", "198.18.0.5", "198.18.0.6"))
	if err != nil {
		t.Fatal(err)
	}
	if svc.Id != 1 {
		t.Errorf("service ID %d, want the freed ID 1", svc.Id)
	}
	live := map[uint32]bool{}
	for _, s := range r.ListServices("") {
		for _, b := range s.Backends {
			if live[b.Id] {
				t.Errorf("backend ID %d used twice", b.Id)
			}
			live[b.Id] = true
		}
	}
}

func TestCorruptStateFilesAreRefusedAndLeftAlone(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.pb")
	s := open(t, good)
	if _, err := s.CreateService(testService("a", "203.0.113.1", "198.18.0.1")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	flip := bytes.Clone(data)
	flip[len(flip)-3] ^= 0x40
	dupID, _ := encodeState(&statev1.State{Services: []*lbdv1.Service{
		{Name: "x", Vip: "203.0.113.1", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP, Id: 1},
		{Name: "y", Vip: "203.0.113.2", Port: 80, Protocol: lbdv1.Protocol_PROTOCOL_TCP, Id: 1},
	}})
	invalidSvc, _ := encodeState(&statev1.State{Services: []*lbdv1.Service{{Name: "x", Vip: "nope", Id: 1}}})
	for name, content := range map[string][]byte{
		"empty":          {},
		"truncated":      data[:len(data)-5],
		"header only":    data[:headerLen],
		"garbage":        bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 64),
		"bit flip":       flip,
		"duplicate id":   dupID,
		"invalid spec":   invalidSvc,
		"future version": append(append([]byte(stateMagic), 0, 0, 0, 9), data[12:]...),
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".pb")
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(Options{Path: path, Limits: DefaultLimits()})
			if !errors.Is(err, ErrCorruptState) {
				t.Fatalf("got %v, want ErrCorruptState", err)
			}
			after, _ := os.ReadFile(path)
			if !bytes.Equal(after, content) {
				t.Errorf("file was modified")
			}
		})
	}
}

func TestSecondStoreOnSameFileIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.pb")
	open(t, path)
	if _, err := Open(Options{Path: path, Limits: DefaultLimits()}); err == nil {
		t.Fatal("a second store opened the same state file")
	}
}

func TestFailedWriteLeavesStateUnchanged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.pb")
	s := open(t, path)
	if _, err := s.CreateService(testService("a", "203.0.113.1", "198.18.0.1")); err != nil {
		t.Fatal(err)
	}
	var events int
	_, _, stop := s.SnapshotAndListen(func(evs []Event) { events += len(evs) })
	defer stop()
	// The journal is closed under the store, so that appending fails; after a failed
	// append the store writes a snapshot and a new journal first, which fails too in a
	// directory that does not exist.
	s.disk.j.Close()
	missing := filepath.Join(dir, "missing", "state.pb")
	s.disk.path, s.disk.jpath = missing, missing+JournalSuffix
	for _, name := range []string{"b", "c"} {
		if _, err := s.CreateService(testService(name, "203.0.113.2", "198.18.0.2")); err == nil {
			t.Fatalf("create %s succeeded although the state could not be written", name)
		}
	}
	if got := s.ListServices(""); len(got) != 1 || events != 0 {
		t.Errorf("state or listeners changed by a failed write: %d services, %d events", len(got), events)
	}
	// Once the files can be written again, the next change goes through, and a restart
	// finds it and nothing of the refused ones.
	s.disk.path, s.disk.jpath = path, path+JournalSuffix
	if _, err := s.CreateService(testService("d", "203.0.113.4", "198.18.0.4")); err != nil {
		t.Fatalf("create after the files are writable again: %v", err)
	}
	s.Close()
	r := open(t, path)
	if got := names(r.ListServices("")); fmt.Sprint(got) != "[a d]" {
		t.Errorf("after a restart: services %v, want [a d]", got)
	}
}

func names(svcs []*lbdv1.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, s.Name)
	}
	return out
}

func TestIDAllocReusesLowestFreeAfterCommit(t *testing.T) {
	a := newIDAlloc([]uint32{5, 2, 3}, false, 0)
	tx := a.begin()
	got := []uint32{tx.get(), tx.get(), tx.get()}
	tx.put(2)
	want := []uint32{1, 4, 6}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if id := tx.get(); id != 7 {
		t.Errorf("ID released in the same transaction was reused: %d", id)
	}
	tx.commit(1)
	tx = a.begin()
	if id := tx.get(); id != 2 {
		t.Errorf("after commit got %d, want 2", id)
	}
	// An aborted transaction hands out the same IDs again.
	tx2 := a.begin()
	if id := tx2.get(); id != 2 {
		t.Errorf("aborted transaction leaked an ID: got %d", id)
	}
}

// TestIDAllocHolds: with hold, a released ID (and, after a restore, every gap) comes
// back only once the change that released it is reconciled.
func TestIDAllocHolds(t *testing.T) {
	a := newIDAlloc([]uint32{3}, true, 0)
	tx := a.begin()
	if id := tx.get(); id != 4 {
		t.Fatalf("gaps of a restored state handed out before the first reconcile: got %d, want 4", id)
	}
	tx.put(3)
	tx.commit(7)
	a.release(0) // the first reconcile (snapshot Seq 0) frees the gaps only
	tx = a.begin()
	if got := []uint32{tx.get(), tx.get(), tx.get()}; fmt.Sprint(got) != "[1 2 5]" {
		t.Fatalf("after the first reconcile: %v, want [1 2 5] (3 still held)", got)
	}
	a.release(6)
	if tx = a.begin(); tx.get() != 1 || tx.get() != 2 || tx.get() != 5 {
		t.Fatal("an ID was freed before the change that released it was reconciled")
	}
	a.release(7)
	tx = a.begin()
	if got := []uint32{tx.get(), tx.get(), tx.get()}; fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("after the release is reconciled: %v, want [1 2 3]", got)
	}
}

// TestMemoryBudget: a change whose services' tables would not fit the budget is refused
// with RESOURCE_EXHAUSTED and changes nothing; the budget itself can be used up.
func TestMemoryBudget(t *testing.T) {
	perSize := func(m uint32) uint64 { return 8 * (2*uint64(m) + 1) }
	// A stand-in for the datapath's figure: a derived size (0) counts as 1021 slots.
	perTable := func(svc *lbdv1.Service) uint64 { return perSize(max(svc.MaglevTableSize, 1021)) }
	s, err := Open(Options{Limits: DefaultLimits(), Memory: func() MemoryBudget {
		return MemoryBudget{Tables: 3 * perSize(65537), Total: 1 << 30, Setting: "datapath.memory_budget", TableBytes: perTable}
	}})
	if err != nil {
		t.Fatal(err)
	}
	svc := func(name, vip string) *lbdv1.Service {
		sv := testService(name, vip, "198.18.0.2")
		sv.MaglevTableSize = 65537
		return sv
	}
	for i, vip := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"} {
		if _, err := s.CreateService(svc(fmt.Sprint("s", i), vip)); err != nil {
			t.Fatalf("service %d of 3, at the budget: %v", i, err)
		}
	}
	_, err = s.CreateService(svc("s4", "203.0.113.4"))
	if Code(err).String() != "ResourceExhausted" || !strings.Contains(err.Error(), "4 services would take 4.0 MiB") ||
		!strings.Contains(err.Error(), "datapath.memory_budget") {
		t.Fatalf("a fourth table: %v, want RESOURCE_EXHAUSTED with the numbers", err)
	}
	if _, err := s.ApplyServices("o", []*lbdv1.Service{svc("a", "203.0.113.5")}); Code(err).String() != "ResourceExhausted" {
		t.Fatalf("apply: %v", err)
	}
	if n, _ := s.Counts(); n != 3 {
		t.Errorf("%d services after the refused calls, want 3", n)
	}
	small := svc("s4", "203.0.113.4")
	small.MaglevTableSize = 0 // a smaller default table does not fit either: 3 big ones fill the budget
	if _, err := s.CreateService(small); Code(err).String() != "ResourceExhausted" {
		t.Errorf("a default-size table over a full budget: %v", err)
	}
	if err := s.DeleteService("s0"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateService(svc("s4", "203.0.113.4")); err != nil {
		t.Errorf("after a delete the budget has room again: %v", err)
	}
}

// TestApplySwapsFrontends: two services of an owner that swap frontends in one apply
// each hold the other's afterwards, and neither frontend is free for a third service.
func TestApplySwapsFrontends(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.pb"))
	a, b := testService("a", "203.0.113.1", "198.18.0.1"), testService("b", "203.0.113.2", "198.18.0.2")
	if _, err := s.ApplyServices("o", []*lbdv1.Service{a, b}); err != nil {
		t.Fatal(err)
	}
	a.Vip, b.Vip = b.Vip, a.Vip
	if res, err := s.ApplyServices("o", []*lbdv1.Service{a, b}); err != nil || res.Updated != 2 {
		t.Fatalf("swap: %+v, %v", res, err)
	}
	for _, vip := range []string{"203.0.113.1", "203.0.113.2"} {
		_, err := s.CreateService(testService("c", vip, "198.18.0.3"))
		if Code(err).String() != "AlreadyExists" {
			t.Errorf("a third service on %s after the swap: %v, want AlreadyExists", vip, err)
		}
	}
}

// TestMemoryBudgetUnknown: while the budget is not known, a change that adds a table is
// refused with UNAVAILABLE and the reason, and changes nothing; one that adds none (a
// drain, a weight, a removal) goes through.
func TestMemoryBudgetUnknown(t *testing.T) {
	unknown, known := true, false
	s, err := Open(Options{Limits: DefaultLimits(), Memory: func() MemoryBudget {
		switch {
		case unknown:
			return MemoryBudget{Unknown: "the datapath is being opened"}
		case known:
			// Room for two tables of 1 KiB.
			return MemoryBudget{Tables: 2048, TableBytes: func(*lbdv1.Service) uint64 { return 1024 }}
		}
		return MemoryBudget{}
	}})
	if err != nil {
		t.Fatal(err)
	}
	unknown = false
	for _, svc := range []*lbdv1.Service{testService("a", "203.0.113.1", "198.18.0.1"), testService("b", "203.0.113.2", "198.18.0.1")} {
		if _, err := s.CreateService(svc); err != nil {
			t.Fatal(err)
		}
	}
	unknown = true
	_, err = s.CreateService(testService("c", "203.0.113.3", "198.18.0.1"))
	if Code(err).String() != "Unavailable" || !strings.Contains(err.Error(), "the datapath is being opened") {
		t.Fatalf("a new service while the budget is unknown: %v, want UNAVAILABLE with the reason", err)
	}
	if n, _ := s.Counts(); n != 2 {
		t.Fatalf("%d services after the refusal", n)
	}
	if _, err := s.UpdateBackendFields("a", &lbdv1.Backend{Address: "198.18.0.1", Port: 80, State: lbdv1.BackendState_BACKEND_STATE_DRAINING},
		BackendUpdate{Fields: []string{"state"}}); err != nil {
		t.Errorf("a drain while the budget is unknown: %v", err)
	}
	if err := s.DeleteService("b"); err != nil {
		t.Errorf("a removal while the budget is unknown: %v", err)
	}
	// Once known, the budget counts the tables of the services created before.
	unknown, known = false, true
	if _, err := s.CreateService(testService("c", "203.0.113.3", "198.18.0.1")); err != nil {
		t.Fatalf("a second table in a budget of two: %v", err)
	}
	if _, err := s.CreateService(testService("d", "203.0.113.4", "198.18.0.1")); Code(err).String() != "ResourceExhausted" {
		t.Fatalf("a third table in a budget of two: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// TestNodeReachabilityEvents: a node's report reaches only the services behind that
// node, as a datapath change when their usable backends change and as a status change
// when only the reason of an unreachable node changes; a reachable node's new reason
// (its next hop's neighbour state) shows nowhere and changes nothing.
func TestNodeReachabilityEvents(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.pb"))
	for _, svc := range []*lbdv1.Service{
		testService("a", "203.0.113.1", "198.18.0.1", "198.18.0.2"),
		testService("b", "203.0.113.2", "198.18.0.2"),
		testService("c", "203.0.113.3", "198.18.0.3"),
	} {
		if _, err := s.CreateService(svc); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	_, _, stop := s.SnapshotAndListen(func(evs []Event) {
		for _, ev := range evs {
			got = append(got, fmt.Sprintf("%s statusOnly=%v", ev.Name, ev.StatusOnly))
		}
	})
	defer stop()
	n1, n2, n3 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.3")
	up := func(why string) NodeReach { return NodeReach{Reachable: true, Reason: why} }
	for _, step := range []struct {
		nodes map[netip.Addr]NodeReach
		want  string
	}{
		{map[netip.Addr]NodeReach{n1: up("REACHABLE"), n2: up("REACHABLE"), n3: up("REACHABLE")}, "[a statusOnly=true b statusOnly=true c statusOnly=true]"},
		{map[netip.Addr]NodeReach{n1: up("STALE"), n2: up("DELAY"), n3: up("REACHABLE")}, "[]"},
		{map[netip.Addr]NodeReach{n1: up("STALE"), n2: {Reason: "FAILED"}, n3: up("REACHABLE")}, "[a statusOnly=false b statusOnly=false]"},
		{map[netip.Addr]NodeReach{n1: up("STALE"), n2: {Reason: "no route"}, n3: up("PROBE")}, "[a statusOnly=true b statusOnly=true]"},
		{map[netip.Addr]NodeReach{n1: up("STALE"), n2: {Reason: "no route"}}, "[c statusOnly=true]"},
	} {
		got = nil
		s.SetNodeReachability(step.nodes)
		if fmt.Sprint(got) != step.want {
			t.Errorf("after %v: events %v, want %s", step.nodes, got, step.want)
		}
	}
	if svc, _ := s.GetService("b"); svc.Backends[0].NodeReachability != lbdv1.Reachability_REACHABILITY_UNREACHABLE {
		t.Errorf("b's backend: %v", svc.Backends[0])
	}
}
