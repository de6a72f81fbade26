//go:build linux

package lbxdp

import (
	"testing"
	"unsafe"
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
		{"MonitorSnapLen", MonitorSnapLen, uint64(lbxdpLbMonSnaplenLB_MON_SNAPLEN)},
		{"traceMetaLen", traceMetaLen, uint64(unsafe.Sizeof(lbxdpLbTraceMeta{}))},
		{"monEventHeader", monEventHeader, uint64(unsafe.Offsetof(lbxdpLbMonEvent{}.Data))},
	} {
		if c.goValue != c.compiled {
			t.Errorf("%s is %d in Go, %d in the program", c.name, c.goValue, c.compiled)
		}
	}
	if got, want := len(lbxdpLbMonEvent{}.Data), MonitorSnapLen; got != want {
		t.Errorf("lb_mon_event carries %d bytes, MonitorSnapLen is %d", got, want)
	}
	spec, err := loadLbxdp()
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Maps[lbxdpMapLbTables].InnerMap.ValueSize; got != TableElemBytes {
		t.Errorf("TableElemBytes is %d in Go, a table element %d bytes in the program", TableElemBytes, got)
	}
}
