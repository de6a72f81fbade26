//go:build linux

package socklb

import "testing"

// The sizes compiled into the programs are the Go defaults: a map whose C size is
// written apart from enum sk_default (or a default Go no longer applies to it) fails.
func TestDefaultsCompiledIn(t *testing.T) {
	compiled, err := loadSocklb()
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
