//go:build linux

package backendtc

import (
	"testing"
	"unsafe"

	"github.com/lbd-dev/lbd/bpf/monring"
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

// The monitor's shared layout and enums, as this program compiles them.
func TestMonitorAsCompiled(t *testing.T) {
	spec, err := loadBackendtc()
	if err != nil {
		t.Fatal(err)
	}
	if err := enumcheck.Names(spec.Types, "lbd_mon_hook", map[uint64]string{
		uint64(HookIngress): "HookIngress", uint64(HookEgress): "HookEgress",
	}, "LBD_MON_HOOK_XDP"); err != nil {
		t.Error(err)
	}
	if err := enumcheck.Names(spec.Types, "lbd_mon_flag", map[uint64]string{
		uint64(backendtcLbdMonFlagLBD_MON_REASONS): "Drops",
	}, "LBD_MON_FORWARDED"); err != nil {
		t.Error(err)
	}
	for _, c := range []struct {
		name           string
		goVal, program uintptr
	}{
		{"monring.SnapLen", monring.SnapLen, uintptr(backendtcLbdMonSnaplenLBD_MON_SNAPLEN)},
		{"monring.SnapLen (data)", monring.SnapLen, uintptr(len(backendtcLbdMonEvent{}.Data))},
		{"monring.EventHeader", monring.EventHeader, unsafe.Offsetof(backendtcLbdMonEvent{}.Data)},
		{"monring.State", unsafe.Sizeof(monring.State{}), unsafe.Sizeof(backendtcLbdMonState{})},
		{"monring.Config", unsafe.Sizeof(monring.Config{}), unsafe.Sizeof(backendtcLbdMonConfig{})},
	} {
		if c.goVal != c.program {
			t.Errorf("%s is %d in Go, %d in the program", c.name, c.goVal, c.program)
		}
	}
}
