//go:build linux

package socklb

import (
	"testing"

	"github.com/lbd-dev/lbd/internal/enumcheck"
)

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
	if err := enumcheck.MapSizes(compiled, sized); err != nil {
		t.Error(err)
	}
}
