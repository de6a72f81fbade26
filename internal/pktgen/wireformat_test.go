package pktgen

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
)

// wireExample matches the example blocks of docs/wire-format.md: a fenced block whose info
// string is "text wire-example NAME", holding hex bytes.
var wireExample = regexp.MustCompile("(?ms)^```text wire-example (\\S+)\\n(.*?)^```")

// TestWireFormatExample: the bytes the wire-format document shows are the bytes the
// builder (and so the LB program, whose tests compare with the builder) produces.
func TestWireFormatExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/wire-format.md")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]netip.AddrPort{
		"ipv4": netip.MustParseAddrPort("198.51.100.10:80"),
		"ipv6": netip.MustParseAddrPort("[2001:db8:100::10]:443"),
	}
	found := 0
	for _, m := range wireExample.FindAllStringSubmatch(string(doc), -1) {
		vip, ok := want[m[1]]
		if !ok {
			t.Errorf("example %q: no service known for it", m[1])
			continue
		}
		found++
		example, err := hex.DecodeString(strings.Join(strings.Fields(m[2]), ""))
		if err != nil {
			t.Fatalf("example %s: %v", m[1], err)
		}
		got := Geneve{VNI: 2, Options: []GeneveOption{DSROption(vip)}}.Header()
		if !bytes.Equal(got, example) {
			t.Errorf("example %s: the document shows\n% x\nthe builder makes\n% x", m[1], example, got)
		}
	}
	if found != len(want) {
		t.Errorf("found %d examples in docs/wire-format.md, want %d", found, len(want))
	}
}
