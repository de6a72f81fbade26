//go:build linux

package integration

import (
	"bufio"
	"fmt"
	"testing"
	"time"
)

// TestKeepaliveOutlivesNAT: an idle connection that the server keeps alive with TCP
// keepalive keeps working although it stays idle far longer than the NAT idle timeout
// lbd used to have. The server's probes leave the backend node through its SNAT, so the
// NAT entry must outlive them: it now follows datapath.tcp_idle_timeout (a quarter
// longer), as the LB nodes' conntrack does.
//
// The timers keep the ratios of the old defaults, scaled from hours to seconds: LB
// flows 6 h → 36 s, keepalive 2 h → 12 s, old NAT idle timeout 1 h → 6 s. With the old
// NAT timeout the first probe, 12 s into the silence, finds no entry, leaves with the
// backend's own address, and the client answers it with a reset.
func TestKeepaliveOutlivesNAT(t *testing.T) {
	tb := newLB(t, options{
		keepalive:    12 * time.Second,
		datapathYAML: ", tcp_idle_timeout: 36s, gc_min_interval: 500ms, gc_max_interval: 1s",
	})
	c, err := tb.dial("tcp", streamVIP)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask := func(line string) (string, error) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintln(c, line); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}
	first, err := ask("before")
	if err != nil {
		t.Fatal(err)
	}
	const idle = 30 * time.Second // five old NAT timeouts, two keepalive probes
	time.Sleep(idle)
	again, err := ask("after")
	if err != nil {
		t.Fatalf("after %v of silence kept alive by the server: %v", idle, err)
	}
	t.Logf("answered %q, then after %v idle %q", first, idle, again)
	if first[:3] != again[:3] {
		t.Errorf("the connection moved from %q to %q", first, again)
	}
}
