package advertise

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/apitest"
	"github.com/lbd-dev/lbd/daemon/store"
	"github.com/lbd-dev/lbd/internal/bgptest"
	"github.com/lbd-dev/lbd/lbctl"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	gobgpapi "github.com/osrg/gobgp/v3/api"
	"google.golang.org/protobuf/encoding/protojson"
)

// lbctlWatch runs lbctl with args in process against server; its stdout arrives line by
// line on the returned channel, closed when lbctl exits.
func lbctlWatch(t *testing.T, server string, args ...string) <-chan string {
	t.Helper()
	pr, pw := io.Pipe()
	lines := make(chan string, 100)
	go func() {
		s := bufio.NewScanner(pr)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	go func() {
		// It ends with the test, when the server stops: its exit code says nothing.
		lbctl.Main(append([]string{"--server", server}, args...), strings.NewReader(""), pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() { pr.Close() })
	return lines
}

// nextRow returns the next row of the watch whose first cells are want (EVENT, PEER,
// AS, UP/DOWN, STATE, ...; an empty one matches any cell).
func nextRow(t *testing.T, lines <-chan string, want ...string) []string {
	t.Helper()
	deadline := time.After(bgptest.WaitFor)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("lbctl ended before printing a row %q", want)
			}
			t.Logf("lbctl: %s", l)
			if f := strings.Fields(l); len(f) >= len(want) && matches(f, want) {
				return f
			}
		case <-deadline:
			t.Fatalf("lbctl printed no row %q within %s", want, bgptest.WaitFor)
		}
	}
}

func matches(cells, want []string) bool {
	for i, w := range want {
		if w != "" && cells[i] != w {
			return false
		}
	}
	return true
}

// TestWatchPeers: `lbctl bgp peers -w`, served by the real API over the controller's
// speaker and a GoBGP router, prints the peers, then a row each time a session goes
// down or comes up, and peers of the API as they are added and deleted.
func TestWatchPeers(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	r := newTestRouter(t, "127.0.0.1", false)
	c := start(t, testConfig(r.peer(false)), st)
	c.waitEstablished(t, "127.0.0.1")
	srv := apitest.StartWithOptions(t, store.DefaultLimits(), api.Options{Store: st, BGP: c})

	// In JSON: one WatchBgpPeersResponse per line, the current peers before SYNCED.
	js := lbctlWatch(t, srv.Addr, "bgp", "peers", "-w", "-o", "json", "--timeout", "60s")
	for _, want := range []lbdv1.WatchEventType{lbdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED, lbdv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED} {
		var ev lbdv1.WatchBgpPeersResponse
		l := <-js
		if err := protojson.Unmarshal([]byte(l), &ev); err != nil || ev.Type != want ||
			(want == lbdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED && ev.GetPeer().GetStatus().GetState() != lbdv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED) {
			t.Fatalf("lbctl -o json printed %q (%v), want %v", l, err, want)
		}
	}

	lines := lbctlWatch(t, srv.Addr, "bgp", "peers", "-w", "--timeout", "60s")
	nextRow(t, lines, "EVENT", "PEER", "AS", "UP/DOWN", "STATE")
	nextRow(t, lines, "added", "127.0.0.1", "65000", "", "established")

	ctx := bgptest.Context(t)
	if err := r.Server.DisablePeer(ctx, &gobgpapi.DisablePeerRequest{Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	nextRow(t, lines, "modified", "127.0.0.1", "65000", "", "idle")
	if err := r.Server.EnablePeer(ctx, &gobgpapi.EnablePeerRequest{Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	nextRow(t, lines, "modified", "127.0.0.1", "65000", "", "established")

	// A peer of the API nobody answers: added, then deleted.
	if _, err := st.CreateBgpPeer(&lbdv1.BgpPeer{Address: "127.0.0.2", PeerAs: bgptest.RouterAS, Port: uint32(bgptest.FreePort(t, "127.0.0.1"))}); err != nil {
		t.Fatal(err)
	}
	nextRow(t, lines, "added", "127.0.0.2")
	if err := st.DeleteBgpPeer("127.0.0.2"); err != nil {
		t.Fatal(err)
	}
	nextRow(t, lines, "deleted", "127.0.0.2")
}
