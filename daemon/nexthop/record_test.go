//go:build linux

package nexthop

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRecord: the record survives a round trip, an empty one removes the file, a
// missing one is empty, a corrupt one is an error, and no temporary file is left.
func TestRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "neighbours.json")
	if got, err := readRecord(path); err != nil || got != nil {
		t.Fatalf("missing record: %v, %v", got, err)
	}
	want := []recordEntry{
		{Interface: "eth1", Address: netip.MustParseAddr("198.18.0.1")},
		{Interface: "eth1", Address: netip.MustParseAddr("2001:db8::1")},
	}
	if err := writeRecord(path, want); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `"interface": "eth1"`) || !strings.Contains(string(b), `"address": "2001:db8::1"`) {
		t.Errorf("record is not the documented JSON:\n%s", b)
	}
	got, err := readRecord(path)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("read back %v, %v; want %v", got, err, want)
	}
	if err := writeRecord(path, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("an empty record left the file: %v", err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readRecord(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("corrupt record: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files left in the directory: %v", ents)
	}
}
