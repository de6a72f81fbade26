//go:build linux

package socklb

import (
	"testing"

	"github.com/lbd-dev/lbd/internal/enumcheck"
)

// Every counter of the programs' enum has a Go name and a field of Stats (bpf2go
// generates the values).
func TestStatsNamed(t *testing.T) {
	spec, err := loadSocklb()
	if err != nil {
		t.Fatal(err)
	}
	if err := enumcheck.Names(spec.Types, "sk_stat", enumcheck.Table(statNames[:]), "SK_STAT_MAX"); err != nil {
		t.Error(err)
	}
	var s Stats
	for c := range numStats {
		if s.field(c) == nil {
			t.Errorf("counter %v has no field in Stats", c)
		}
	}
	if got, want := len(s.List()), int(numStats); got != want {
		t.Errorf("Stats.List has %d counters, want %d", got, want)
	}
}
