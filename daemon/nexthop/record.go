//go:build linux

package nexthop

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// recordEntry is one neighbour entry the tracker created. Interfaces are recorded by
// name: an index means nothing to the next boot.
type recordEntry struct {
	Interface string     `json:"interface"`
	Address   netip.Addr `json:"address"`
}

// record is the file's content.
type record struct {
	Entries []recordEntry `json:"entries"`
}

// readRecord returns the entries of the record at path; none if path is "" or the file
// does not exist.
func readRecord(path string) ([]recordEntry, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read neighbour record: %w", err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parse neighbour record %s: %w", path, err)
	}
	return r.Entries, nil
}

// writeRecord replaces the record at path with entries, through a temporary file
// renamed over it, so that a crash leaves the old record or the new one. No entries:
// the file is removed.
func writeRecord(path string, entries []recordEntry) error {
	if len(entries) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove neighbour record: %w", err)
		}
		return nil
	}
	b, err := json.MarshalIndent(record{Entries: entries}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode neighbour record: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("create neighbour record: %w", err)
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write neighbour record: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("replace neighbour record: %w", err)
	}
	return nil
}

// saveRecord writes the tracker's entries (adopted or still pending) if they changed.
func (t *Tracker) saveRecord() error {
	if !t.dirty {
		return nil
	}
	if t.recordPath != "" {
		entries := slices.Clone(t.pending)
		for k, name := range t.owned {
			entries = append(entries, recordEntry{Interface: name, Address: k.addr})
		}
		slices.SortFunc(entries, func(a, b recordEntry) int {
			if c := strings.Compare(a.Interface, b.Interface); c != 0 {
				return c
			}
			return a.Address.Compare(b.Address)
		})
		if err := writeRecord(t.recordPath, entries); err != nil {
			return err
		}
	}
	t.dirty = false
	return nil
}
