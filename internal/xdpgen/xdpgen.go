//go:build linux

// Package xdpgen injects packets at line rate for tests and benchmarks. An XDP program
// run by BPF_PROG_RUN in live-frame mode (BPF_F_TEST_XDP_LIVE_FRAMES) writes each frame
// from a template and returns XDP_TX, which the kernel turns into a real transmission
// out of the interface the run names. Frames can repeat one flow, be a new flow each
// (source address and port counted over a range), or give each new flow two packets, a
// SYN then an ACK: what an LRU table must see twice before it treats an entry as in use
// (docs/testing.md, "A conntrack flood").
//
// A veth transmits XDP frames only if its peer runs an XDP program (or has GRO on): the
// receiving side needs one, such as the Counter this package also provides.
package xdpgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/lbd-dev/lbd/internal/pktgen"
	"github.com/lbd-dev/lbd/internal/progrun"
	"github.com/lbd-dev/lbd/internal/testnet"
	"golang.org/x/sys/unix"
)

// Mode says how frames vary.
type Mode uint32

// Modes, as xdpgen.c numbers them.
const (
	// OneFlow sends the template every time.
	OneFlow Mode = iota
	// NewFlow makes packet n flow n: a source address and port from n.
	NewFlow
	// SynThenAck makes packets 2n and 2n+1 flow n: its SYN (the template), then an ACK
	// whose sequence number is one past the SYN's. The template must be a TCP SYN.
	SynThenAck
)

func (m Mode) String() string {
	switch m {
	case OneFlow:
		return "one flow"
	case NewFlow:
		return "new flow per packet"
	case SynThenAck:
		return "each new flow twice, SYN then ACK"
	}
	return fmt.Sprintf("mode(%d)", uint32(m))
}

// MaxFrame is the largest template: a 1500-byte IP packet in an untagged Ethernet frame.
const MaxFrame = 1514

// Offsets in the template, which is untagged Ethernet, IPv4 without options, then TCP or
// UDP.
const (
	ipOff = 14
	l4Off = ipOff + 20
)

// Config describes the frames of a Gen.
type Config struct {
	// Frame is the template: an untagged Ethernet frame holding an IPv4 packet without
	// options (never a fragment) that carries TCP or UDP, its checksums right (the
	// program updates them incrementally). pktgen.Packet builds one.
	Frame []byte
	Mode  Mode
	// Sources and Ports are how many source addresses and ports flows take, counted up
	// from the template's (0 means 1). Flow f has address base + f mod Sources and
	// port base + (f / Sources) mod Ports, so the flows repeat after Sources × Ports.
	// OneFlow takes neither.
	Sources, Ports int
	// Batch is how many frames the kernel prepares and transmits at a time (1 to
	// 256; 0 means 64, the kernel's default).
	Batch int
	// Pin makes the sending thread run on CPU during Send.
	Pin bool
	CPU int
	// Priority, if not 0, makes the sending thread SCHED_FIFO with this priority
	// during Send: on a busy machine the injector then sends without pauses, ahead of
	// every normal task on its CPU (the kernel keeps them 5% of it).
	Priority int
	// Pacer and Window, if Window is not 0, make Send wait whenever Window frames it
	// sent have not been counted yet by the pacer's counters: the receiver gets every
	// frame, as fast as the path between delivers them. Without, Send offers frames
	// as fast as it can and the path drops what it cannot take.
	Pacer  *Pacer
	Window int
}

// Gen is a loaded injector. Its flow sequence continues from one Send to the next.
type Gen struct {
	cfg  Config
	objs xdpgenObjects
	mu   sync.Mutex
}

// Load checks the configuration and loads the program. Every address a frame may carry
// must be inside the test address plan (testnet.InPlan): the injector never sends
// anything else.
func Load(cfg Config) (*Gen, error) {
	if cfg.Sources == 0 {
		cfg.Sources = 1
	}
	if cfg.Ports == 0 {
		cfg.Ports = 1
	}
	if cfg.Batch == 0 {
		cfg.Batch = 64
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	g := &Gen{cfg: cfg}
	spec, err := loadXdpgen()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Send    *ebpf.Program `ebpf:"xg_send"`
		Cfg     *ebpf.Map     `ebpf:"xg_cfg"`
		Seq     *ebpf.Map     `ebpf:"xg_seq"`
		Arrived *ebpf.Map     `ebpf:"xg_arrived"`
	}
	if err := spec.LoadAndAssign(&objs, cfg.Pacer.replacements()); err != nil {
		return nil, fmt.Errorf("load injector: %w", err)
	}
	g.objs.XgSend, g.objs.XgCfg, g.objs.XgSeq, g.objs.XgArrived = objs.Send, objs.Cfg, objs.Seq, objs.Arrived
	if err := g.writeConfig(0, 0, 0); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

func (c Config) check() error {
	f := c.Frame
	if len(f) < l4Off+8 || len(f) > MaxFrame {
		return fmt.Errorf("xdpgen: a %d-byte frame; want %d to %d bytes", len(f), l4Off+8, MaxFrame)
	}
	if et := binary.BigEndian.Uint16(f[12:]); et != 0x0800 {
		return fmt.Errorf("xdpgen: EtherType %#04x; want untagged IPv4", et)
	}
	ip := f[ipOff:]
	if ip[0] != 0x45 {
		return fmt.Errorf("xdpgen: IPv4 version and header length %#02x; want 0x45 (no options)", ip[0])
	}
	if tot := int(binary.BigEndian.Uint16(ip[2:])); tot != len(ip) {
		return fmt.Errorf("xdpgen: IPv4 total length %d, but the frame holds %d bytes of IP", tot, len(ip))
	}
	if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
		return errors.New("xdpgen: the template is a fragment")
	}
	proto := ip[9]
	switch {
	case proto == pktgen.ProtoUDP:
	case proto == pktgen.ProtoTCP && len(f) >= l4Off+20:
	default:
		return fmt.Errorf("xdpgen: protocol %d; want TCP or UDP", proto)
	}
	if err := pktgen.VerifyIP(ip); err != nil {
		return fmt.Errorf("xdpgen: template: %w", err)
	}
	switch c.Mode {
	case OneFlow:
		if c.Sources != 1 || c.Ports != 1 {
			return errors.New("xdpgen: OneFlow takes no range of sources or ports")
		}
	case NewFlow:
	case SynThenAck:
		if proto != pktgen.ProtoTCP || TCPFlags(f)&(pktgen.SYN|pktgen.ACK) != pktgen.SYN {
			return errors.New("xdpgen: SynThenAck needs a TCP SYN template")
		}
	default:
		return fmt.Errorf("xdpgen: unknown mode %d", c.Mode)
	}
	if c.Sources < 1 || c.Ports < 1 {
		return fmt.Errorf("xdpgen: %d sources and %d ports; want at least 1 of each", c.Sources, c.Ports)
	}
	if c.Window < 0 || c.Window > 0 && c.Pacer == nil {
		return fmt.Errorf("xdpgen: a window of %d frames needs a pacer", c.Window)
	}
	if c.Priority < 0 || c.Priority > 99 {
		return fmt.Errorf("xdpgen: priority %d; want 1 to 99, or 0", c.Priority)
	}
	if c.Batch < 1 || c.Batch > 256 {
		return fmt.Errorf("xdpgen: batch %d; want 1 to 256", c.Batch)
	}
	src := binary.BigEndian.Uint32(ip[12:])
	if uint64(src)+uint64(c.Sources)-1 > 0xffffffff {
		return errors.New("xdpgen: the source addresses wrap around")
	}
	if sport := binary.BigEndian.Uint16(f[l4Off:]); int(sport)+c.Ports-1 > 0xffff {
		return fmt.Errorf("xdpgen: %d ports from %d wrap around", c.Ports, sport)
	}
	first := netip.AddrFrom4([4]byte(ip[12:16]))
	var last [4]byte
	binary.BigEndian.PutUint32(last[:], src+uint32(c.Sources)-1)
	dst := netip.AddrFrom4([4]byte(ip[16:20]))
	if !testnet.InPlan(dst) || !samePlanPrefix(first, netip.AddrFrom4(last)) {
		return fmt.Errorf("xdpgen: sources %v to %v or destination %v outside the test address plan",
			first, netip.AddrFrom4(last), dst)
	}
	return nil
}

// samePlanPrefix reports whether a and b, and so every address between, are inside one
// prefix of the test address plan.
func samePlanPrefix(a, b netip.Addr) bool {
	for _, p := range []netip.Prefix{testnet.Nodes, testnet.VIPs} {
		if p.Contains(a) && p.Contains(b) {
			return true
		}
	}
	return false
}

// TCPFlags returns the TCP flags of a frame the injector sends.
func TCPFlags(frame []byte) pktgen.TCPFlags { return pktgen.TCPFlags(frame[l4Off+13]) }

func (g *Gen) writeConfig(limit, seqBase, arrivedBase uint64) error {
	v := xdpgenXgConfig{
		Len:         uint32(len(g.cfg.Frame)),
		Mode:        uint32(g.cfg.Mode),
		Addrs:       uint32(g.cfg.Sources),
		Ports:       uint32(g.cfg.Ports),
		Limit:       limit,
		Window:      uint64(g.cfg.Window),
		SeqBase:     seqBase,
		ArrivedBase: arrivedBase,
	}
	copy(v.Data[:], g.cfg.Frame)
	if err := g.objs.XgCfg.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("xdpgen: write configuration: %w", err)
	}
	return nil
}

// SetWindow changes the Window of the Sends to come; 0 stops pacing.
func (g *Gen) SetWindow(window int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.cfg
	c.Window = window
	if err := c.check(); err != nil {
		return err
	}
	g.cfg = c
	return nil
}

// Close unloads the program.
func (g *Gen) Close() error {
	return errors.Join(g.objs.XgSend.Close(), g.objs.XgCfg.Close(), g.objs.XgSeq.Close(), g.objs.XgArrived.Close())
}

// Sent returns the number of frames sent since Load: the next packet's number.
func (g *Gen) Sent() (uint64, error) {
	s, err := g.state()
	return s.Seq, err
}

func (g *Gen) state() (xdpgenXgState, error) {
	var s xdpgenXgState
	if err := g.objs.XgSeq.Lookup(uint32(0), &s); err != nil {
		return s, fmt.Errorf("xdpgen: read sequence: %w", err)
	}
	return s, nil
}

// Flow returns the source of packet n and its TCP flags (0 for UDP), as the program
// writes them: what a test expects to see.
func (g *Gen) Flow(n uint64) (netip.AddrPort, pktgen.TCPFlags) {
	f := g.cfg.Frame
	src := binary.BigEndian.Uint32(f[ipOff+12:])
	sport := binary.BigEndian.Uint16(f[l4Off:])
	var flags pktgen.TCPFlags
	if f[ipOff+9] == pktgen.ProtoTCP {
		flags = TCPFlags(f)
	}
	flow := n
	switch g.cfg.Mode {
	case OneFlow:
		flow = 0
	case SynThenAck:
		flow = n / 2
		if n%2 == 1 {
			flags = pktgen.ACK
		}
	}
	src += uint32(flow % uint64(g.cfg.Sources))
	sport += uint16(flow / uint64(g.cfg.Sources) % uint64(g.cfg.Ports))
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], src)
	return netip.AddrPortFrom(netip.AddrFrom4(a), sport), flags
}

// idleRuns is how many runs a paced call may spend waiting beyond the frames it
// sends: about a tenth of a second of waiting, after which Send looks whether frames
// still arrive.
const idleRuns = 4 << 20

// stallAfter is how long a paced Send waits for an arrival before it gives up: long
// enough for a busy machine to schedule the receivers again. A variable for the test.
var stallAfter = 5 * time.Second

// Send transmits count frames out of ifname, an interface of ns (its veth peer must run
// XDP or have GRO on), continuing the flow sequence. It returns how many frames the
// program handed to the interface, which is count unless an error stopped it, and the
// time from the first frame to the last. Unpaced, a frame the interface could not
// queue (its peer's ring full) counts as sent: the receiver counts what arrived.
// Paced, Send fails if frames stop arriving.
func (g *Gen) Send(ns *testnet.NS, ifname string, count int) (int, time.Duration, error) {
	if count <= 0 {
		return 0, 0, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	start, err := g.Sent()
	if err != nil {
		return 0, 0, err
	}
	limit := start + uint64(count)
	var arrived uint64
	if g.cfg.Window > 0 {
		if arrived, err = g.cfg.Pacer.Arrived(); err != nil {
			return 0, 0, err
		}
	}
	if err := g.writeConfig(limit, start, arrived); err != nil {
		return 0, 0, err
	}
	var wall time.Duration
	err = ns.DoErr(func() error {
		ifindex, err := netInterface(ifname)
		if err != nil {
			return err
		}
		if g.cfg.Pin {
			// The thread is locked to this goroutine until Send ends; it goes back to
			// the runtime with the CPUs it had.
			var old, one unix.CPUSet
			if err := unix.SchedGetaffinity(0, &old); err != nil {
				return fmt.Errorf("xdpgen: %w", err)
			}
			one.Set(g.cfg.CPU)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return fmt.Errorf("xdpgen: run on CPU %d: %w", g.cfg.CPU, err)
			}
			defer unix.SchedSetaffinity(0, &old)
		}
		if g.cfg.Priority != 0 {
			old, err := unix.SchedGetAttr(0, 0)
			if err != nil {
				return fmt.Errorf("xdpgen: %w", err)
			}
			rt := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(g.cfg.Priority)}
			if err := unix.SchedSetAttr(0, &rt, 0); err != nil {
				return fmt.Errorf("xdpgen: SCHED_FIFO %d: %w", g.cfg.Priority, err)
			}
			defer unix.SchedSetAttr(0, old, 0)
		}
		t0 := time.Now()
		defer func() { wall = time.Since(t0) }()
		progress, last := t0, start
		for {
			seq, err := g.Sent()
			if err != nil {
				return err
			}
			if seq >= limit {
				return nil
			}
			// One call for everything, since each call costs a setup and teardown;
			// a paced one with room to wait. A signal ends a call early (EINTR).
			repeat := limit - seq
			if g.cfg.Window > 0 {
				repeat += idleRuns
			}
			err = g.run(ifindex, uint32(min(repeat, math.MaxUint32)))
			if err != nil && !errors.Is(err, unix.EINTR) {
				return fmt.Errorf("xdpgen: send on %s: %w", ifname, err)
			}
			if err == nil && g.cfg.Window > 0 {
				now, err := g.Sent()
				if err != nil {
					return err
				}
				if now != last {
					progress, last = time.Now(), now
				} else if time.Since(progress) > stallAfter {
					return fmt.Errorf("xdpgen: paced send on %s stalled for %v: %d of %d frames sent, %d not counted by the pacer",
						ifname, stallAfter, now-start, count, g.cfg.Window)
				}
			}
		}
	})
	st, serr := g.state()
	if serr != nil {
		return 0, wall, errors.Join(err, serr)
	}
	dur := wall
	if st.Seq == limit && st.LastNs > st.FirstNs {
		dur = time.Duration(st.LastNs - st.FirstNs)
	}
	return int(st.Seq - start), dur, err
}

// xdpMD is struct xdp_md, the context of an XDP run.
type xdpMD struct {
	Data, DataEnd, DataMeta uint32
	IngressIfindex, RxQueue uint32
	EgressIfindex           uint32
}

// run makes one live-frame run of repeat frames on the interface ifindex of the
// calling thread's namespace.
func (g *Gen) run(ifindex int, repeat uint32) error {
	data := g.cfg.Frame
	md := &xdpMD{DataEnd: uint32(len(data)), IngressIfindex: uint32(ifindex)}
	// The raw call (package progrun): cilium/ebpf's Run restarts an interrupted run with
	// its whole repeat count; Send goes on with what is left.
	attr := progrun.Attr{
		ProgFD:     uint32(g.objs.XgSend.FD()),
		DataSizeIn: uint32(len(data)),
		DataIn:     uint64(uintptr(unsafe.Pointer(&data[0]))),
		Repeat:     repeat,
		CtxSizeIn:  uint32(unsafe.Sizeof(*md)),
		CtxIn:      uint64(uintptr(unsafe.Pointer(md))),
		Flags:      unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		BatchSize:  uint32(g.cfg.Batch),
	}
	err := progrun.Run(&attr)
	runtime.KeepAlive(data)
	runtime.KeepAlive(md)
	return err
}

// netInterface returns the index of an interface of the calling thread's namespace.
func netInterface(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return 0, fmt.Errorf("xdpgen: %w", err)
	}
	return ifc.Index, nil
}
