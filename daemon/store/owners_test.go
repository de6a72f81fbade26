package store

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// TestWriterChecksOwnersInTheChange: every change of a Writer asks its check about the
// owner each touched service has before and after; a refusal changes nothing and
// comes back as it is.
func TestWriterChecksOwnersInTheChange(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.pb"))
	mine := testService("mine", "203.0.113.1", "198.18.0.1")
	mine.Owner = "team-a"
	theirs := testService("theirs", "203.0.113.2", "198.18.0.2")
	theirs.Owner = "team-b"
	for _, svc := range []*lbdv1.Service{mine, theirs} {
		if _, err := s.CreateService(svc); err != nil {
			t.Fatal(err)
		}
	}
	refused := errors.New("refused")
	var asked []string
	w := s.As(func(service, owner string) error {
		asked = append(asked, service+"="+owner)
		if owner != "team-a" {
			return refused
		}
		return nil
	})
	backend := &lbdv1.Backend{Address: "198.18.0.9", Port: 80}
	for _, tc := range []struct {
		name    string
		change  func() error
		asked   []string
		allowed bool
	}{
		{"backend of its own", func() error { _, err := w.CreateBackend("mine", backend); return err }, []string{"mine=team-a", "mine=team-a"}, true},
		{"backend of another", func() error { _, err := w.CreateBackend("theirs", backend); return err }, []string{"theirs=team-b"}, false},
		{"update another", func() error {
			svc := testService("theirs", "203.0.113.3")
			svc.Owner = "team-b"
			_, err := w.UpdateService(svc, 0)
			return err
		}, []string{"theirs=team-b"}, false},
		{"delete another", func() error { return w.DeleteService("theirs") }, []string{"theirs=team-b"}, false},
		{"create for another", func() error {
			svc := testService("new", "203.0.113.4")
			svc.Owner = "team-b"
			_, err := w.CreateService(svc)
			return err
		}, []string{"new=team-b"}, false},
		{"apply as another", func() error { _, err := w.ApplyServices("team-b", nil); return err }, []string{"theirs=team-b"}, false},
		{"plan as another", func() error { _, err := w.PlanServices("team-b", nil); return err }, []string{"theirs=team-b"}, false},
		{"delete its own backend", func() error { return w.DeleteBackend("mine", "198.18.0.9", 80) }, []string{"mine=team-a", "mine=team-a"}, true},
	} {
		asked = nil
		before := s.ListServices("")
		seq := s.Seq()
		err := tc.change()
		if !slices.Equal(asked, tc.asked) {
			t.Errorf("%s: asked %v, want %v", tc.name, asked, tc.asked)
		}
		if tc.allowed {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, refused) {
			t.Errorf("%s: %v, want the check's refusal", tc.name, err)
		}
		after := s.ListServices("")
		if s.Seq() != seq || len(after) != len(before) || !slices.EqualFunc(before, after, func(a, b *lbdv1.Service) bool { return proto.Equal(a, b) }) {
			t.Errorf("%s: refused, and the state changed", tc.name)
		}
	}
}
