package lbctl

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// TestEnumLabels checks the flag values and table words derived from the API's enums,
// and that every enum of the API follows the naming the derivation relies on.
func TestEnumLabels(t *testing.T) {
	// The API's enums are spread over the files of its package; check them all.
	files := 0
	protoregistry.GlobalFiles.RangeFilesByPackage(lbdv1.File_lbd_v1_api_proto.Package(), func(fd protoreflect.FileDescriptor) bool {
		files++
		enums := fd.Enums()
		for i := range enums.Len() {
			ed := enums.Get(i)
			prefix := enumPrefix(ed)
			for j := range ed.Values().Len() {
				if name := string(ed.Values().Get(j).Name()); !strings.HasPrefix(name, prefix) {
					t.Errorf("%s value %s lacks the prefix %s", ed.Name(), name, prefix)
				}
			}
		}
		return true
	})
	if files == 0 {
		t.Fatal("no file of the API package is registered")
	}
	for _, tc := range []struct {
		e    protoreflect.Enum
		want string
	}{
		{lbdv1.Protocol(0), "[tcp udp sctp]"},
		{lbdv1.HashMode(0), "[five-tuple source-address]"},
		{lbdv1.HealthCheckType(0), "[none tcp http https]"},
		{lbdv1.ServiceState(0), "[pending ready no-backends error]"},
		{lbdv1.BgpSessionState(0), "[idle connect active opensent openconfirm established]"},
		{lbdv1.AdvertisePolicy(0), "[if-healthy always]"},
	} {
		ed := tc.e.Descriptor()
		if got := fmt.Sprint(enumLabels(ed)); got != tc.want {
			t.Errorf("%s labels %s, want %s", ed.Name(), got, tc.want)
		}
	}
	if got := label(lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS, "-"); got != "no-backends" {
		t.Errorf("label = %q", got)
	}
	if got := label(lbdv1.ServiceState(0), "-"); got != "-" {
		t.Errorf("label of zero = %q", got)
	}
	if got := label(lbdv1.ServiceState(42), "-"); got != "42" {
		t.Errorf("label of an unknown value = %q", got)
	}
	if n := enumNumber(lbdv1.HashMode(0).Descriptor(), "source-address"); lbdv1.HashMode(n) != lbdv1.HashMode_HASH_MODE_SOURCE_ADDRESS {
		t.Errorf("enumNumber = %v", n)
	}
}

func TestParseBackendSpec(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want *lbdv1.Backend
	}{
		{"198.18.1.1:80", &lbdv1.Backend{Address: "198.18.1.1", Port: 80}},
		{"198.18.1.1:0,weight=3", &lbdv1.Backend{Address: "198.18.1.1", Weight: 3}},
		{"[2001:db8::1]:443,node=198.18.0.1,state=disabled", &lbdv1.Backend{
			Address: "2001:db8::1", Port: 443, NodeAddress: "198.18.0.1", State: lbdv1.BackendState_BACKEND_STATE_DISABLED,
		}},
	} {
		got, err := parseBackendSpec(tc.spec)
		if err != nil || !proto.Equal(got, tc.want) {
			t.Errorf("parseBackendSpec(%q) = %v, %v; want %v", tc.spec, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "198.18.1.1", "2001:db8::1:80", "198.18.1.1:80,", "198.18.1.1:80,weight", "198.18.1.1:80,weight=-1", "198.18.1.1:80,state=up", "198.18.1.1:80,port=1"} {
		if _, err := parseBackendSpec(bad); err == nil {
			t.Errorf("parseBackendSpec(%q) succeeded", bad)
		}
	}
}

func TestSortAndFormat(t *testing.T) {
	bs := []*lbdv1.Backend{
		{Address: "2001:db8::1", Port: 80}, {Address: "198.18.1.10", Port: 80}, {Address: "198.18.1.9", Port: 8080},
		{Address: "198.18.1.9", Port: 80},
	}
	sortBackends(bs)
	var got []string
	for _, b := range bs {
		got = append(got, formatEndpoint(b.Address, b.Port))
	}
	if want := "[198.18.1.9:80 198.18.1.9:8080 198.18.1.10:80 [2001:db8::1]:80]"; fmt.Sprint(got) != want {
		t.Errorf("sorted backends %v, want %s", got, want)
	}
	for d, want := range map[string]string{"0s": "00:00:00", "59m59s": "00:59:59", "23h59m59s": "23:59:59", "24h": "1d 00:00:00", "1000h1s": "41d 16:00:01", "-5s": "00:00:00"} {
		dur, err := time.ParseDuration(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := formatAge(dur); got != want {
			t.Errorf("formatAge(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestServerTarget(t *testing.T) {
	for server, want := range map[string]string{
		"unix:///run/lbd/lbd.sock": "unix:///run/lbd/lbd.sock",
		"/run/lbd/lbd.sock":        "unix:///run/lbd/lbd.sock",
		"./lbd.sock":               "unix:./lbd.sock",
		"lb1.example:50051":        "dns:///lb1.example:50051 tcp",
		"[2001:db8::1]:50051":      "dns:///[2001:db8::1]:50051 tcp",
	} {
		o := globalOptions{server: server}
		target, tcp, err := o.target()
		got := target
		if tcp {
			got += " tcp"
		}
		if err != nil || got != want {
			t.Errorf("target(%q) = %q, %v; want %q", server, got, err, want)
		}
	}
	for _, bad := range []string{"", "unix:", "unix:///", "lb1.example", "lb1.example:http", ":50051", "2001:db8::1:50051"} {
		o := globalOptions{server: bad}
		if _, _, err := o.target(); err == nil {
			t.Errorf("target(%q) succeeded", bad)
		}
	}
}
