package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	statev1 "github.com/lbd-dev/lbd/proto/lbd/state/v1"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// crashImage copies the state file and its journal as they are on disk now, while the
// store that writes them is still open: what a restart after a crash at this moment
// would find (every acknowledged change is synced). It returns the copy's path.
func crashImage(t *testing.T, path string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{filepath.Base(path), filepath.Base(path) + JournalSuffix} {
		data, err := os.ReadFile(filepath.Join(filepath.Dir(path), name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, filepath.Base(path))
}

// sameServices fails unless two stores list the same services (IDs and revisions too).
func sameServices(t *testing.T, want, got *Store) {
	t.Helper()
	w, g := want.ListServices(""), got.ListServices("")
	if len(w) != len(g) {
		t.Fatalf("%d services, want %d", len(g), len(w))
	}
	for i := range w {
		w[i].Status, g[i].Status = nil, nil
		if !proto.Equal(w[i], g[i]) {
			t.Fatalf("service %s differs:\n got %v\nwant %v", w[i].Name, g[i], w[i])
		}
	}
}

// TestJournalReplaysAfterCrash: after a crash, a restart finds every acknowledged change
// of every kind, from the journal on top of the last snapshot.
func TestJournalReplaysAfterCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.pb")
	s := open(t, path)
	if _, err := s.ApplyServices("k8s", benchServices(50, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateService(testService("a", "203.0.113.251", "198.18.0.1", "198.18.0.2")); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteService("ns-0/svc-7"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateBackendFields("a", &lbdv1.Backend{Address: "198.18.0.2", Port: 80, Weight: 7}, BackendUpdate{Fields: []string{"weight"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateBgpPeer(&lbdv1.BgpPeer{Address: "198.18.0.254", PeerAs: 65000, Password: "pw"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateBgpPeer(&lbdv1.BgpPeer{Address: "198.18.0.253", PeerAs: 65001}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteBgpPeer("198.18.0.253"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetDrained(true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("a snapshot was written for a small state: the test would not read the journal")
	}
	r := open(t, crashImage(t, path))
	sameServices(t, s, r)
	if !r.Drained() {
		t.Error("drain flag lost")
	}
	if p := r.BgpPeers(true); len(p) != 1 || p[0].Spec.Address != "198.18.0.254" || p[0].Spec.Password != "pw" {
		t.Errorf("peers after replay: %v", p)
	}
	// IDs continue from the replayed state: the deleted service's ID comes back first.
	svc, err := r.CreateService(testService("b", "203.0.113.252", "198.18.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	if svc.Id != 8 {
		t.Errorf("new service got ID %d, want 8 (freed by ns-0/svc-7)", svc.Id)
	}
}

// TestJournalCompaction: once the journal outgrows the snapshot, a snapshot is written
// in the background and the journal starts again after it; a crash at any point of
// that (before, between the two files, after) restores the same state.
func TestJournalCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.pb")
	s := open(t, path)
	svcs := benchServices(2000, 10) // about 0.5 MiB an apply
	if _, err := s.ApplyServices("k8s", svcs); err != nil {
		t.Fatal(err)
	}
	before := crashImage(t, path) // the journal holds the first apply, no snapshot yet
	for i := range svcs {
		svcs[i].Backends[0].Weight = 2
	}
	if _, err := s.ApplyServices("k8s", svcs); err != nil {
		t.Fatal(err)
	}
	s.waitCompaction()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("no snapshot after %d bytes of journal: %v", s.disk.size, err)
	}
	if s.disk.size != journalHdrLen {
		t.Errorf("journal holds %d bytes after the snapshot, want only its header", s.disk.size)
	}
	t.Logf("snapshot of %d bytes", st.Size())
	// Between the two steps: the new snapshot, and the old journal with entries it holds.
	between := crashImage(t, path)
	if err := os.WriteFile(between+JournalSuffix, mustRead(t, before+JournalSuffix), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateService(testService("a", "203.0.113.251", "198.18.0.1")); err != nil {
		t.Fatal(err)
	}
	after := crashImage(t, path)
	for name, p := range map[string]string{"between": between, "after": after} {
		t.Run(name, func(t *testing.T) {
			r := open(t, p)
			n, _ := r.Counts()
			if want := map[string]int{"between": 2000, "after": 2001}[name]; n != want {
				t.Fatalf("%d services, want %d", n, want)
			}
			svc, err := r.GetService(svcs[0].Name)
			if err != nil || svc.Backends[0].Weight != 2 || svc.Revision != 2 {
				t.Fatalf("service after replay: %v (%v)", svc, err)
			}
		})
	}
	r := open(t, after)
	sameServices(t, s, r)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitCompaction waits for a running compaction to end.
func (s *Store) waitCompaction() {
	s.writeMu.Lock()
	c := s.disk.compacting
	s.writeMu.Unlock()
	if c != nil {
		<-c
	}
}

// TestJournalTornTail: a crash while an entry was being appended leaves part of it; the
// restart drops it (the change was never acknowledged) and keeps the others.
func TestJournalTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.pb")
	s := open(t, path)
	for i := range 3 {
		if _, err := s.CreateService(testService(fmt.Sprint("s", i), fmt.Sprintf("203.0.113.%d", i+1), "198.18.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	img := crashImage(t, path)
	whole := mustRead(t, img+JournalSuffix)
	frame, err := encodeFrame(s.journalEntryOf(testService("s9", "203.0.113.9", "198.18.0.9")))
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{3, frameHdrLen, len(frame) - 1} {
		t.Run(fmt.Sprint("cut at ", cut), func(t *testing.T) {
			p := crashImage(t, img)
			torn := append(bytes.Clone(whole), frame[:cut]...)
			if err := os.WriteFile(p+JournalSuffix, torn, 0o600); err != nil {
				t.Fatal(err)
			}
			r := open(t, p)
			if got := names(r.ListServices("")); fmt.Sprint(got) != "[s0 s1 s2]" {
				t.Fatalf("services %v, want [s0 s1 s2]", got)
			}
			if got := mustRead(t, p+JournalSuffix); !bytes.Equal(got, whole) {
				t.Errorf("journal is %d bytes after the restart, want the %d of its whole entries", len(got), len(whole))
			}
			// The next change goes after the last whole entry.
			if _, err := r.CreateService(testService("s3", "203.0.113.4", "198.18.0.1")); err != nil {
				t.Fatal(err)
			}
			r.Close()
			if got := names(open(t, p).ListServices("")); fmt.Sprint(got) != "[s0 s1 s2 s3]" {
				t.Fatalf("after one more change and a restart: %v", got)
			}
		})
	}
}

// journalEntryOf is the entry that would create svc.
func (s *Store) journalEntryOf(svc *lbdv1.Service) *statev1.JournalEntry {
	return &statev1.JournalEntry{Sequence: 4, Services: []*lbdv1.Service{svc}}
}

// TestCorruptJournalIsRefusedAndLeftAlone: damage that is not a torn last entry, and a
// journal that does not continue the state file, stop the store with ErrCorruptState
// and leave both files as they are.
func TestCorruptJournalIsRefusedAndLeftAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.pb")
	s := open(t, path)
	for i := range 3 {
		if _, err := s.CreateService(testService(fmt.Sprint("s", i), fmt.Sprintf("203.0.113.%d", i+1), "198.18.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	journal := mustRead(t, crashImage(t, path)+JournalSuffix)
	s0, _ := s.GetService("s0")
	s0.Status = nil
	// A state file from a backup taken after the first change.
	backup, err := encodeState(&statev1.State{Sequence: 1, Services: []*lbdv1.Service{s0}})
	if err != nil {
		t.Fatal(err)
	}
	firstFrame := journalHdrLen + frameHdrLen + 4
	flip := bytes.Clone(journal)
	flip[firstFrame] ^= 0x40
	// The entries of a journal whose first two changes are cut out.
	j, err := decodeJournal(journal)
	if err != nil {
		t.Fatal(err)
	}
	gap := journalHeader()
	f, _ := encodeFrame(j.entries[2])
	gap = append(gap, f...)
	for name, tc := range map[string]struct {
		state, journal []byte
		why            string
	}{
		"bit flip before the last entry": {nil, flip, "checksum mismatch"},
		"not a journal":                  {nil, bytes.Repeat([]byte("x"), 40), "does not start with"},
		"future version":                 {nil, append([]byte(journalMagic+"\x00\x00\x00\x09"), journal[journalHdrLen:]...), "format version 9"},
		"changes missing":                {nil, gap, "changes are missing"},
		"state file older than journal":  {backup, gap, "change 3 follows change 1"},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "state.pb")
			if tc.state != nil {
				if err := os.WriteFile(p, tc.state, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(p+JournalSuffix, tc.journal, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(Options{Path: p, Limits: DefaultLimits()})
			if !errors.Is(err, ErrCorruptState) || !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), JournalSuffix) {
				t.Fatalf("got %v, want ErrCorruptState naming the journal and %q", err, tc.why)
			}
			if got := mustRead(t, p+JournalSuffix); !bytes.Equal(got, tc.journal) {
				t.Error("journal was modified")
			}
		})
	}
}
