//go:build linux

package backendtc

import (
	"testing"

	"github.com/lbd-dev/lbd/internal/enumcheck"
)

// Every counter of the program's enum has a Go name (bpf2go generates the values).
func TestCountersNamed(t *testing.T) {
	spec, err := loadBackendtc()
	if err != nil {
		t.Fatal(err)
	}
	if err := enumcheck.Names(spec.Types, "counter", enumcheck.Table(counterNames[:]), "CNT_MAX"); err != nil {
		t.Error(err)
	}
}
