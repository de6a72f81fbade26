//go:build linux

package monring

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// record lays out a struct lbd_mon_event as the programs write it.
func record(capLen int, data []byte) []byte {
	b := make([]byte, EventHeader, EventHeader+len(data))
	binary.NativeEndian.PutUint64(b[0:], uint64(3*time.Second))
	binary.NativeEndian.PutUint32(b[8:], 7)
	binary.NativeEndian.PutUint32(b[12:], 1500)
	binary.NativeEndian.PutUint16(b[16:], uint16(capLen))
	b[18], b[19], b[20] = 12, 2, 1
	return append(b, data...)
}

func TestParse(t *testing.T) {
	data := bytes.Repeat([]byte{0xab}, SnapLen)
	e, err := Parse(record(40, data))
	if err != nil {
		t.Fatal(err)
	}
	if e.Time != 3*time.Second || e.Ifindex != 7 || e.Len != 1500 || e.Reason != 12 || e.Verdict != 2 || e.Hook != 1 ||
		!bytes.Equal(e.Data, data[:40]) {
		t.Errorf("parsed %+v", e)
	}
	for name, b := range map[string][]byte{
		"shorter than its header":       record(0, nil)[:EventHeader-1],
		"more captured than SnapLen":    record(SnapLen+1, append(data, 0)),
		"more captured than it carries": record(41, data[:40]),
	} {
		if _, err := Parse(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
