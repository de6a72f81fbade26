//go:build linux

package backendtc

import (
	"testing"

	"github.com/lbd-dev/lbd/internal/enumcheck"
)

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
	if err := enumcheck.MapSizes(compiled, sized); err != nil {
		t.Error(err)
	}
}
