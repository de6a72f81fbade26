package lbctl

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/lbd-dev/lbd/daemon/apitest"
)

// TestQUICService: a QUIC-aware UDP service through lbctl: its routing and its
// backends' server IDs as stored and as shown, a server ID changed by field, and lbd's
// refusals (a server ID of the wrong length, one that another backend has).
func TestQUICService(t *testing.T) {
	t.Parallel()
	srv := apitest.Start(t)
	ok(t, srv, "service", "create", "h3", "--vip", "203.0.113.10", "--port", "443", "--protocol", "udp",
		"--quic-server-id-length", "2", "--quic-config-id", "1",
		"--backend", "198.18.1.10:443,quic-id=0a01", "--backend", "198.18.1.11:443")
	ok(t, srv, "backend", "add", "h3", "198.18.1.12:443", "--quic-server-id", "0a03")
	if out := ok(t, srv, "backend", "set-quic-server-id", "h3", "198.18.1.11:443", "0a02"); out != "backend 198.18.1.11:443 of service \"h3\": QUIC server ID 0a02\n" {
		t.Errorf("set-quic-server-id printed %q", out)
	}

	svc := getService(t, srv, "h3")
	if q := svc.GetQuic(); q.GetConfigId() != 1 || q.GetServerIdLength() != 2 {
		t.Errorf("QUIC routing as stored: %v", q)
	}
	var ids []string
	for _, b := range svc.Backends {
		ids = append(ids, b.Address+"="+hex.EncodeToString(b.QuicServerId))
	}
	if got, want := strings.Join(ids, " "), "198.18.1.10=0a01 198.18.1.11=0a02 198.18.1.12=0a03"; got != want {
		t.Errorf("server IDs as stored: %s, want %s", got, want)
	}

	detail := ok(t, srv, "service", "get", "h3")
	if !strings.Contains(detail, "QUIC routing:                 by server ID: 2 bytes, config rotation 1\n") {
		t.Errorf("service get shows no QUIC routing:\n%s", detail)
	}
	_, backendTable, _ := strings.Cut(detail, "\n\n")
	rows := table(t, backendTable)
	if len(rows) != 4 || rows[0][len(rows[0])-1] != "QUIC-ID" || rows[2][len(rows[2])-1] != "0a02" {
		t.Errorf("backend table:\n%s", backendTable)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"backend", "set-quic-server-id", "h3", "198.18.1.11:443", "0a0203"}, "backend.quic_server_id"},
		{[]string{"backend", "set-quic-server-id", "h3", "198.18.1.11:443", "0a01"}, "backend.quic_server_id"},
		{[]string{"backend", "add", "h3", "198.18.1.13:443", "--quic-server-id", "0a03"}, "backend.quic_server_id"},
		{[]string{"service", "update", "h3", "--quic-server-id-length", "3"}, "quic_server_id"},
	} {
		r := lbctl(t, srv, c.args...)
		if r.code == ExitOK || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want a refusal naming %s", c.args, r.code, r.stderr, c.want)
		}
	}
	if after := getService(t, srv, "h3"); hex.EncodeToString(after.Backends[1].QuicServerId) != "0a02" || len(after.Backends) != 3 ||
		after.GetQuic().GetServerIdLength() != 2 {
		t.Errorf("refused changes changed the service: %v", after)
	}

	// Off only once no backend has a server ID: lbd does not drop them silently.
	if r := lbctl(t, srv, "service", "update", "h3", "--quic-server-id-length", "0"); r.code == ExitOK || !strings.Contains(r.stderr, "quic_server_id") {
		t.Errorf("QUIC routing turned off under backends with server IDs: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, be := range []string{"198.18.1.10:443", "198.18.1.11:443", "198.18.1.12:443"} {
		ok(t, srv, "backend", "set-quic-server-id", "h3", be, "")
	}
	ok(t, srv, "service", "update", "h3", "--quic-server-id-length", "0")
	if svc := getService(t, srv, "h3"); svc.Quic != nil {
		t.Errorf("QUIC routing still on: %v", svc.Quic)
	}
	if detail := ok(t, srv, "service", "get", "h3"); !strings.Contains(detail, "QUIC routing:                 none\n") || strings.Contains(detail, "QUIC-ID") {
		t.Errorf("service get after QUIC routing was turned off:\n%s", detail)
	}
}
