//go:build linux

package socklb

import (
	"testing"
	"time"

	"github.com/lbd-dev/lbd/bpf/lbxdp"
)

// BenchmarkConnect measures what the hook adds to connect(): a client process
// connects to a TCP listener in a backend namespace (over a veth) and closes at once
// (reset, so no TIME_WAIT piles up), b.N times.
//
//   - direct: the client is in a cgroup without programs and connects to the
//     backend's address.
//   - socklb: the client is in the cgroup with the socket programs and connects to the
//     VIP, which they translate to the same backend. For the ratio "socklb/direct"
//     the direct loop runs too, in chunks interleaved with the socklb chunks, so that
//     both figures of a run see the same load of this shared machine.
//
// ns/connect is the clients' own figure (the loop inside the agent process), free of
// the request round trip that ns/op includes; in "socklb" ns/op covers both loops.
func BenchmarkConnect(b *testing.B) {
	e := newEnv(b, 1)
	e.addBackends()
	e.service(lbxdp.ServiceKey{VIP: vipA, Port: portLine, Proto: lbxdp.ProtoTCP}, lbxdp.Service{ID: 1}, map[uint32]uint32{id4(1): 1})
	direct := e.startAgent(newCgroup(b, "", "plain"))
	sock := e.startAgent(e.cgroup)
	backend := ap(e.backends[0].addr4, portLine)
	vip := ap(vipA, portLine)
	// Warm up both paths (neighbour entries, the agents' code).
	direct.do(agentReq{Op: "bench", Addr: backend, N: 200})
	sock.do(agentReq{Op: "bench", Addr: vip, N: 200})

	perConnect := func(a *agent, addr string, n int) float64 {
		return float64(a.do(agentReq{Op: "bench", Addr: addr, N: n, Timeout: 5 * time.Second}).Total.Nanoseconds()) / float64(n)
	}
	b.Run("direct", func(b *testing.B) {
		b.ResetTimer()
		b.ReportMetric(perConnect(direct, backend, b.N), "ns/connect")
	})
	b.Run("socklb", func(b *testing.B) {
		const chunk = 500
		var hooked, base float64
		b.ResetTimer()
		for done := 0; done < b.N; done += chunk {
			n := min(chunk, b.N-done)
			hooked += perConnect(sock, vip, n) * float64(n)
			base += perConnect(direct, backend, n) * float64(n)
		}
		b.ReportMetric(hooked/float64(b.N), "ns/connect")
		b.ReportMetric(hooked/base, "socklb/direct")
	})
}
