//go:build linux

package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"github.com/lbd-dev/lbd/daemon/model/modeltest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/xdpgen"
)

// newFlows loads an injector of new flows from frame's source: 198.19.0.0/16 and ports
// from 32768 give 2^31 flows before one repeats. The sequence goes on from one flood to
// the next.
func newFlows(tb testing.TB, frame []byte) *xdpgen.Gen {
	tb.Helper()
	// 2^21 distinct flows, then they repeat: however fast the machine sends, the flood
	// and the established flows together stay below the capacity of the resized
	// conntrack (1.25 × 2^21), so an insert the test counts on never meets a full map.
	g, err := xdpgen.Load(xdpgen.Config{Frame: frame, Mode: xdpgen.NewFlow, Sources: 1 << 16, Ports: 1 << 5})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}

// flood sends an injector's flows into a node's uplink, from its peer, until it is
// stopped: the attached LB program, old or new, takes them.
type flood struct {
	gen   *xdpgen.Gen
	start uint64
	stop  chan struct{}
	done  chan error
}

// startFlood sends perSecond flows a second, in bursts every 100 ms (a live-frame run
// takes about 30 ms to set up whatever its size), or as fast as they go (0).
func startFlood(tb testing.TB, n *node, g *xdpgen.Gen, perSecond int) *flood {
	tb.Helper()
	start, err := g.Sent()
	if err != nil {
		tb.Fatal(err)
	}
	f := &flood{gen: g, start: start, stop: make(chan struct{}), done: make(chan error, 1)}
	burst, every := 1<<16, time.Duration(0)
	if perSecond > 0 {
		burst, every = max(perSecond/10, 1), 100*time.Millisecond
	}
	peer := "dpb" + strings.TrimPrefix(n.uplink, "dpa")
	go func() {
		next := time.Now()
		for {
			select {
			case <-f.stop:
				f.done <- nil
				return
			default:
			}
			if every > 0 {
				next = next.Add(every)
				time.Sleep(time.Until(next))
			}
			if _, _, err := g.Send(n.ns, peer, burst); err != nil {
				f.done <- err
				return
			}
		}
	}()
	tb.Cleanup(func() {
		if err := f.end(); err != nil {
			tb.Error(err)
		}
	})
	return f
}

// sent is how many flows the flood has sent.
func (f *flood) sent(tb testing.TB) uint64 {
	tb.Helper()
	n, err := f.gen.Sent()
	if err != nil {
		tb.Fatal(err)
	}
	return n - f.start
}

// end stops the flood and returns the error that stopped it earlier, if one did.
func (f *flood) end() error {
	select {
	case <-f.stop:
		return nil
	default:
		close(f.stop)
		return <-f.done
	}
}

// establish sends a SYN, then an ACK of every flow through the LB program. The second
// packet marks the entry referenced before it leaves the CPU's pending list, so that
// the kernel's LRU files it with the active entries and evicts entries never looked up
// again (a flood's) first (docs/testing.md).
func establish(tb testing.TB, n *node, m *Manager, flows []lbxdp.Flow) {
	tb.Helper()
	ifindex := n.ns.Interface(tb, n.uplink).Index
	n.ns.Do(tb, func() {
		for _, f := range flows {
			for _, flags := range []pktgen.TCPFlags{pktgen.SYN, pktgen.ACK} {
				frame := pktgen.Packet{Src: f.Src.Addr(), Dst: f.Dst.Addr(), SrcPort: f.Src.Port(),
					DstPort: f.Dst.Port(), Flags: flags}.Frame()
				v, err := m.lb.Program().Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256),
					Context: lbxdp.XDPMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}})
				if err != nil {
					tb.Fatalf("run LB program: %v", err)
				}
				if lbxdp.Verdict(v) != lbxdp.XDPTx {
					tb.Fatalf("packet of %v: verdict %v, want XDP_TX", f, lbxdp.Verdict(v))
				}
			}
		}
	})
}

// rawEntries reads a map's keys and values.
func rawEntries(tb testing.TB, m *ebpf.Map) map[string][]byte {
	tb.Helper()
	out := map[string][]byte{}
	buf := newBatchBuf(migrationBatch, int(m.KeySize()), int(m.ValueSize()))
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, buf.keys(0, buf.n), buf.values(0, buf.n), nil)
		for i := range n {
			out[string(buf.key(i))] = bytes.Clone(buf.value(i))
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// pinsAsideLeft fails the test if a pin moved aside is left in the node's bpffs.
func pinsAsideLeft(tb testing.TB, n *node) {
	tb.Helper()
	for _, d := range []string{"lb", "backend", "socket"} {
		aside, err := pinsAside(filepath.Join(n.bpffs, d))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			tb.Fatal(err)
		}
		if len(aside) > 0 {
			tb.Errorf("pins moved aside left in %s: %v", d, aside)
		}
	}
}

// lockedLog collects a logger's output for the test to print.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) lines(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// TestResizeConntrackUnderFlood restarts an LB node with a larger conntrack while new
// flows come through the attached program, before, during and after the switch, at
// 3,000 a second and as fast as one CPU sends them; the old conntrack is full, so
// the flood's inserts into it fail while it is copied. Every established entry is carried
// over unchanged, and so is every entry the old program left in its map, the ones it
// wrote after the first copy included.
func TestResizeConntrackUnderFlood(t *testing.T) {
	for _, tc := range []struct {
		name      string
		perSecond int
	}{{"3000 new flows a second", 3000}, {"as fast as one CPU sends", 0}} {
		t.Run(tc.name, func(t *testing.T) { resizeUnderFlood(t, tc.perSecond) })
	}
}

func resizeUnderFlood(t *testing.T, perSecond int) {
	const oldSize, newSize, established = 1 << 18, 1 << 21, 65000
	n := newNode(t)
	m := n.open(t, n.config(oldSize))
	svc := service(1, "web", "203.0.113.10", 80, 251, backend(1, "198.18.10.1", 8080, active), backend(2, "198.18.10.2", 8080, active))
	if _, err := m.Sync(context.Background(), modeltest.All(svc)); err != nil {
		t.Fatal(err)
	}
	// The flood fills part of the table first, then the established flows come. The
	// other way round, they would be demoted while the table fills (the LRU moves
	// unreferenced active entries to its inactive list while that list is the
	// shorter), as flows that stay silent for that long would be; and in a full table
	// the kernel evicts referenced entries too when a scan of its inactive list finds
	// nothing else.
	sent := func(f *flood, n uint64) {
		deadline := time.Now().Add(10 * time.Second)
		for f.sent(t) < n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	g := newFlows(t, pktgen.Packet{
		Src: netip.MustParseAddr("198.19.0.0"), Dst: netip.MustParseAddr("203.0.113.10"),
		SrcPort: 32768, DstPort: 80, Flags: pktgen.SYN,
	}.Frame())
	f := startFlood(t, n, g, 0)
	sent(f, oldSize/4)
	if err := f.end(); err != nil {
		t.Fatal(err)
	}
	var flows []lbxdp.Flow
	for _, e := range ctEntries(established, 1, 1, 2, time.Hour, 1) {
		flows = append(flows, e.Flow)
	}
	establish(t, n, m, flows)
	before := map[lbxdp.Flow]lbxdp.CTEntry{}
	for _, fl := range flows {
		e, ok, err := m.lb.ConntrackLookup(fl)
		if err != nil || !ok || e.State != lbxdp.CTEstablished {
			t.Fatalf("flow %v: %+v %v %v", fl, e, ok, err)
		}
		before[fl] = e
	}

	// The flood goes on through the restart: the old table is full and refuses inserts.
	f = startFlood(t, n, g, 0)
	sent(f, oldSize)
	if perSecond > 0 {
		if err := f.end(); err != nil {
			t.Fatal(err)
		}
		f = startFlood(t, n, g, perSecond)
	}
	full := dump(t, m)
	gone := 0
	for fl := range before {
		if _, ok := full[fl]; !ok {
			gone++
		}
	}
	if gone > 0 {
		t.Fatalf("the flood evicted %d established entries before the restart: the test proves nothing", gone)
	}
	t.Logf("before the restart: %d entries (%d established)", len(full), len(before))
	counters, err := m.lb.ServiceCounters(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// Kept open to read what the old program left in its map once it is switched.
	oldCT, err := ebpf.LoadPinnedMap(filepath.Join(n.bpffs, "lb", lbxdp.MapConntrack4), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer oldCT.Close()

	logs := &lockedLog{}
	var m2 *Manager
	frames0, start := f.sent(t), time.Now()
	n.ns.Do(t, func() {
		m2, err = Open(n.config(newSize), hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}))
	})
	took, frames := time.Since(start), f.sent(t)-frames0
	if ferr := f.end(); ferr != nil {
		t.Fatalf("flood: %v", ferr)
	}
	for _, l := range logs.lines("op=migrate map=lb_ct4") {
		t.Log(l)
	}
	if err != nil {
		newCT, lerr := ebpf.LoadPinnedMap(filepath.Join(n.bpffs, "lb", lbxdp.MapConntrack4), nil)
		if lerr == nil {
			kept := rawEntries(t, newCT)
			newCT.Close()
			est := 0
			for k := range kept {
				// The established flows come from 100.1.0.0/16, the flood from 198.19.0.0/16.
				if k[0] == 100 {
					est++
				}
			}
			t.Fatalf("restart with conntrack_size %d under the flood: %v; the new map holds %d entries of %d, %d of the %d established",
				newSize, err, len(kept), len(full), est, len(before))
		}
		t.Fatalf("restart with conntrack_size %d under the flood: %v", newSize, err)
	}
	t.Cleanup(func() { m2.Close() })
	after, err := m2.lb.ServiceCounters(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restart took %v: %d frames sent meanwhile (%.0f/s), %d new flows inserted by the old and new programs (%.0f/s)",
		took.Round(time.Millisecond), frames, float64(frames)/took.Seconds(),
		after.NewFlows-counters.NewFlows, float64(after.NewFlows-counters.NewFlows)/took.Seconds())

	got := dump(t, m2)
	lost := 0
	for fl, e := range before {
		if got[fl] != e {
			if lost++; lost <= 5 {
				t.Errorf("established entry %v: %+v before the restart, %+v after", fl, e, got[fl])
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d established entries lost or changed", lost, len(before))
	}
	oldLeft := rawEntries(t, oldCT)
	newCT, err := ebpf.LoadPinnedMap(filepath.Join(n.bpffs, "lb", lbxdp.MapConntrack4), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer newCT.Close()
	newHas := rawEntries(t, newCT)
	missing := 0
	for k := range oldLeft {
		if _, ok := newHas[k]; !ok {
			missing++
		}
	}
	t.Logf("the old map held %d entries when its program was switched; the new one holds %d", len(oldLeft), len(newHas))
	if missing > 0 {
		t.Errorf("%d of the %d entries the old program left are not in the new map", missing, len(oldLeft))
	}
	if capacity := int(newCT.MaxEntries()); len(newHas) >= capacity {
		t.Errorf("the new map is full (%d of %d): inserts may have failed, make it larger", len(newHas), capacity)
	}
	pinsAsideLeft(t, n)
}

// rawFlow decodes the key of an IPv4 flow in lb_ct4: saddr, daddr, sport and
// dport (network order), proto.
func rawFlow(k []byte) lbxdp.Flow {
	// struct lb_ct4_key: saddr, daddr, sport, dport, proto.
	return lbxdp.Flow{
		Src:   netip.AddrPortFrom(netip.AddrFrom4([4]byte(k[0:4])), binary.BigEndian.Uint16(k[8:])),
		Dst:   netip.AddrPortFrom(netip.AddrFrom4([4]byte(k[4:8])), binary.BigEndian.Uint16(k[10:])),
		Proto: k[12],
	}
}

// TestInterruptedMigrationIsFinished leaves the pins a start that stopped in the middle
// of resizing the conntrack leaves, and starts again: the entries of the map moved
// aside are carried over, a newer entry of the same flow in the current map wins, and
// no pin is left aside.
func TestInterruptedMigrationIsFinished(t *testing.T) {
	const size, resized, again = 1 << 16, 1 << 17, 1 << 18
	for _, tc := range []struct {
		name string
		// loaded: the stopped start had loaded its programs, which created and pinned
		// a map of size resized (and wrote into it).
		loaded bool
		size   uint32 // of the next start
	}{
		{"before the load, size set back", false, size},
		{"before the load", false, resized},
		{"after the load", true, resized},
		{"after the load, size changed again", true, again},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			m := n.open(t, n.config(size))
			svc := service(1, "web", "203.0.113.10", 80, 251, backend(1, "198.18.10.1", 8080, active), backend(2, "198.18.10.2", 8080, active))
			if _, err := m.Sync(context.Background(), modeltest.All(svc)); err != nil {
				t.Fatal(err)
			}
			if _, err := m.lb.RestoreConntrack(ctEntries(20000, 1, 1, 2, time.Hour, 1)); err != nil {
				t.Fatal(err)
			}
			want := dump(t, m)
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(n.bpffs, "lb")
			pin := filepath.Join(dir, lbxdp.MapConntrack4)
			// The XDP program stays attached to the map moved aside, as after a crash.
			if err := os.Rename(pin, pin+migratingSuffix); err != nil {
				t.Fatal(err)
			}
			if tc.loaded {
				spec, err := lbxdp.Spec(lbxdp.Options{PinPath: dir, ConntrackSize: resized})
				if err != nil {
					t.Fatal(err)
				}
				cur, err := ebpf.NewMapWithOptions(spec.Maps[lbxdp.MapConntrack4], ebpf.MapOptions{PinPath: dir})
				if err != nil {
					t.Fatal(err)
				}
				defer cur.Close()
				old, err := ebpf.LoadPinnedMap(pin+migratingSuffix, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer old.Close()
				// The new programs saw two flows: one the old map holds (its entry is
				// newer: it takes another entry's value), one it does not.
				var keys [][]byte
				var vals [][]byte
				for k, v := range rawEntries(t, old) {
					keys, vals = append(keys, []byte(k)), append(vals, v)
				}
				newer, other := 0, 1
				for want[rawFlow(keys[other])].BackendID == want[rawFlow(keys[newer])].BackendID {
					other++
				}
				fresh := bytes.Clone(keys[newer])
				fresh[0] = 101
				for _, k := range [][]byte{keys[other], fresh} {
					if err := cur.Update(k, vals[newer], ebpf.UpdateNoExist); err != nil {
						t.Fatal(err)
					}
				}
				for _, k := range [][]byte{keys[other], fresh} {
					e := want[rawFlow(keys[newer])]
					e.Flow = rawFlow(k)
					want[e.Flow] = e
				}
			}

			logs := &lockedLog{}
			var m2 *Manager
			var err error
			n.ns.Do(t, func() {
				m2, err = Open(n.config(tc.size), hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}))
			})
			for _, l := range logs.lines("op=migrate") {
				t.Log(l)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer m2.Close()
			if len(logs.lines("stopped in the middle of migrating this map")) != 1 {
				t.Error("the interrupted migration was not logged")
			}
			if got := m2.lb.Options().ConntrackSize; got != tc.size {
				t.Errorf("conntrack size %d, want %d", got, tc.size)
			}
			got := dump(t, m2)
			if len(got) != len(want) {
				t.Errorf("%d entries, want %d", len(got), len(want))
			}
			for f, e := range want {
				if got[f] != e {
					t.Fatalf("flow %v: %+v, want %+v", f, got[f], e)
				}
			}
			pinsAsideLeft(t, n)
		})
	}
}
