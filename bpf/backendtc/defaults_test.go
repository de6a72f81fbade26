//go:build linux

package backendtc

import "testing"

// The NAT table's size compiled into the program is the Go default.
func TestDefaultsCompiledIn(t *testing.T) {
	compiled, err := loadBackendtc()
	if err != nil {
		t.Fatal(err)
	}
	sized, err := Spec(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range compiled.Maps {
		if got, want := sized.Maps[name].MaxEntries, m.MaxEntries; got != want {
			t.Errorf("map %s: %d entries with the Go defaults, %d compiled in", name, got, want)
		}
	}
}
