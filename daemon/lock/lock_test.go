package lock

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSecondAcquireNamesHolder: a lock held through one open file refuses a second
// acquisition (even in the same process, as flock locks belong to open files), naming
// the holder's PID; after Release it can be taken again.
func TestSecondAcquireNamesHolder(t *testing.T) {
	for _, tc := range []struct {
		name string
		path func(t *testing.T) string
	}{
		{"file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "x.lock") }},
		{"directory", func(t *testing.T) string { return t.TempDir() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.path(t)
			h, err := Acquire(p, "thing "+p)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Acquire(p, "thing "+p)
			if !errors.Is(err, ErrHeld) {
				t.Fatalf("second acquire: %v, want ErrHeld", err)
			}
			want := "thing " + p + " is in use by another lbd (PID " + strconv.Itoa(os.Getpid()) + ")"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
			if err := h.Release(); err != nil {
				t.Fatal(err)
			}
			h2, err := Acquire(p, "thing")
			if err != nil {
				t.Fatalf("after release: %v", err)
			}
			h2.Release()
		})
	}
}

func TestAcquireMissingDirectoryParent(t *testing.T) {
	if _, err := Acquire(filepath.Join(t.TempDir(), "no", "such", "x.lock"), "thing"); err == nil || errors.Is(err, ErrHeld) {
		t.Fatalf("got %v, want an open error", err)
	}
}
