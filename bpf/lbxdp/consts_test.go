//go:build linux

package lbxdp

import (
	"testing"
	"unsafe"

	"github.com/lbd-dev/lbd/bpf/monring"
)

// Constants Go needs untyped (they size arrays and mix with ints and uint32s) are
// written in Go; each must equal what bpf2go generates from the C side.
func TestConstantsAsCompiled(t *testing.T) {
	for _, c := range []struct {
		name     string
		goValue  uint64
		compiled uint64
	}{
		{"MaxQUICServerIDLen", MaxQUICServerIDLen, uint64(lbxdpLbQuicSidLB_QUIC_SID_MAX)},
		{"vipFilterOrder", vipFilterOrder, uint64(lbxdpLbVipFilterOrderLB_VIP_FILTER_ORDER)},
		{"slotsPerElem", slotsPerElem, uint64(lbxdpLbTableLayoutLB_TABLE_SLOTS)},
		{"idsPerElem", idsPerElem, uint64(lbxdpLbTableLayoutLB_TABLE_IDS)},
		{"MonitorSnapLen", MonitorSnapLen, uint64(lbxdpLbdMonSnaplenLBD_MON_SNAPLEN)},
		{"traceMetaLen", traceMetaLen, uint64(unsafe.Sizeof(lbxdpLbTraceMeta{}))},
		{"monring.EventHeader", monring.EventHeader, uint64(unsafe.Offsetof(lbxdpLbdMonEvent{}.Data))},
		{"monring.State", uint64(unsafe.Sizeof(monring.State{})), uint64(unsafe.Sizeof(lbxdpLbdMonState{}))},
		{"monring.Config", uint64(unsafe.Sizeof(monring.Config{})), uint64(unsafe.Sizeof(lbxdpLbdMonConfig{}))},
	} {
		if c.goValue != c.compiled {
			t.Errorf("%s is %d in Go, %d in the program", c.name, c.goValue, c.compiled)
		}
	}
	if got, want := len(lbxdpLbdMonEvent{}.Data), MonitorSnapLen; got != want {
		t.Errorf("lbd_mon_event carries %d bytes, MonitorSnapLen is %d", got, want)
	}
	spec, err := loadLbxdp()
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Maps[lbxdpMapLbTables].InnerMap.ValueSize; got != TableElemBytes {
		t.Errorf("TableElemBytes is %d in Go, a table element %d bytes in the program", TableElemBytes, got)
	}
}
