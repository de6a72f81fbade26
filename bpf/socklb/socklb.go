//go:build linux

// Package socklb loads the socket-level load balancer (socklb.c): cgroup v2 programs
// that translate connect() and unconnected UDP sends to a service into its backend
// before any packet exists, and translate the backend back in recvmsg() and
// getpeername(), so that processes on a node reach VIPs directly and only ever see
// VIP:port (the technique of Cilium's host-reachable services).
//
// It keeps no service state of its own: Load takes the maps of a loaded lbxdp
// Datapath (VIPs, services, Maglev tables, backends), so drain, disable, health and
// weights are what the XDP datapath's tables say. Its own maps are the reverse
// translations (per socket), the backends of unconnected UDP sockets, the session
// affinity of local clients (a network namespace is a client) and counters.
//
// Behaviour worth knowing:
//   - TCP and connected UDP choose a backend per connect(); unconnected UDP keeps
//     one backend per socket and service while that backend exists.
//   - A service without a usable backend fails connect() and sendmsg() at once
//     with ECONNREFUSED.
//   - IPv4-mapped IPv6 destinations of dual-stack sockets find IPv4 services.
//   - Source ranges are not applied: a local socket has no client address yet.
//   - A closing socket removes its connected reverse entry; entries of unconnected
//     UDP sockets stay until the LRU map evicts them.
package socklb

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
)

// Map sizes used when Options leave them zero: the sizes compiled into the programs
// (enum sk_default), as bpf2go generates them.
const (
	DefaultRevNATSize   = uint32(socklbSkDefaultSK_DEFAULT_REVNAT_SIZE)
	DefaultUDPSize      = uint32(socklbSkDefaultSK_DEFAULT_UDP_SIZE)
	DefaultAffinitySize = uint32(socklbSkDefaultSK_DEFAULT_AFF_SIZE)
)

// Options configure Load.
type Options struct {
	// LB supplies the service state maps; required. The socket programs only read them.
	LB *lbxdp.Datapath
	// PinPath, when set, is the bpffs directory the socket-level maps are pinned in
	// (and adopted from).
	PinPath string
	// RevNATSize is the number of translated sockets (per peer) the LRU reverse map holds.
	RevNATSize uint32
	// UDPSize is the number of (unconnected UDP socket, service) backends remembered.
	UDPSize uint32
	// AffinitySize is the number of (network namespace, service) affinity entries.
	AffinitySize uint32
}

func (o *Options) setDefaults() {
	if o.RevNATSize == 0 {
		o.RevNATSize = DefaultRevNATSize
	}
	if o.UDPSize == 0 {
		o.UDPSize = DefaultUDPSize
	}
	if o.AffinitySize == 0 {
		o.AffinitySize = DefaultAffinitySize
	}
}

// Names of the maps that hold what only the programs know, which the daemon migrates
// by name; bpf2go generates them from the programs.
const (
	MapRevNAT     = socklbMapSkRevnat
	MapUDPBackend = socklbMapSkUdpBackend
	MapAffinity   = socklbMapSkAffinity
)

// Spec returns the collection Load would load for opts: sizes applied, the service
// state maps sized like opts.LB's.
func Spec(opts Options) (*ebpf.CollectionSpec, error) {
	opts.setDefaults()
	spec, err := loadSocklb()
	if err != nil {
		return nil, fmt.Errorf("load socklb spec: %w", err)
	}
	sizes := map[string]uint32{
		socklbMapSkRevnat:     opts.RevNATSize,
		socklbMapSkUdpBackend: opts.UDPSize,
		socklbMapSkAffinity:   opts.AffinitySize,
	}
	if opts.LB != nil {
		for name, m := range opts.LB.StateMaps() {
			sizes[name] = m.MaxEntries()
		}
	}
	for name, m := range spec.Maps {
		if n, ok := sizes[name]; ok {
			m.MaxEntries = n
		}
		if opts.PinPath == "" {
			m.Pinning = ebpf.PinNone
		}
	}
	return spec, nil
}

// Hook is one program and the cgroup attach point it belongs to.
type Hook struct {
	// Name names the hook ("connect4", "sendmsg6", "sock_release", ...).
	Name       string
	Program    *ebpf.Program
	AttachType ebpf.AttachType
}

// Datapath is a loaded instance of the socket-level programs.
type Datapath struct {
	objs socklbObjects
	opts Options
}

// Load loads the programs with opts.LB's service state maps in place of their own.
// A verifier error is returned whole: print it with %+v to see the log.
func Load(opts Options) (*Datapath, error) {
	if opts.LB == nil {
		return nil, errors.New("load socklb: no lbxdp datapath to share service state with")
	}
	opts.setDefaults()
	spec, err := Spec(opts)
	if err != nil {
		return nil, err
	}
	state := opts.LB.StateMaps()
	for name := range state {
		// The shared maps are the LB datapath's; never pin or adopt copies of them here.
		spec.Maps[name].Pinning = ebpf.PinNone
	}
	d := &Datapath{opts: opts}
	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: opts.PinPath},
		MapReplacements: state,
	})
	if err != nil {
		return nil, fmt.Errorf("load socklb objects: %w", err)
	}
	return d, nil
}

// Close releases the program and map handles. Pinned maps stay in bpffs.
func (d *Datapath) Close() error {
	if err := d.objs.Close(); err != nil {
		return fmt.Errorf("close socklb objects: %w", err)
	}
	return nil
}

// Options returns the options the Datapath was loaded with, defaults filled in.
func (d *Datapath) Options() Options { return d.opts }

// Hooks returns every program with its attach type, in a fixed order.
func (d *Datapath) Hooks() []Hook {
	p := d.objs.socklbPrograms
	return []Hook{
		{"connect4", p.SkConnect4, ebpf.AttachCGroupInet4Connect},
		{"connect6", p.SkConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", p.SkSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", p.SkSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", p.SkRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", p.SkRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername4", p.SkGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", p.SkGetpeername6, ebpf.AttachCgroupInet6GetPeername},
		{"sock_release", p.SkRelease, ebpf.AttachCgroupInetSockRelease},
	}
}

// AttachHook attaches one hook to the cgroup v2 directory at path, as a BPF link
// (other programs on the cgroup are left alone).
func AttachHook(h Hook, path string) (link.Link, error) {
	l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: h.AttachType, Program: h.Program})
	if err != nil {
		return nil, fmt.Errorf("attach %s to cgroup %s: %w", h.Name, path, err)
	}
	return l, nil
}

// Attach attaches every hook to the cgroup v2 directory at path. On error nothing
// stays attached.
func (d *Datapath) Attach(path string) ([]link.Link, error) {
	var links []link.Link
	for _, h := range d.Hooks() {
		l, err := AttachHook(h, path)
		if err != nil {
			for _, l := range links {
				l.Close()
			}
			return nil, err
		}
		links = append(links, l)
	}
	return links, nil
}

// CgroupID returns the ID of the cgroup v2 directory at path (its inode number), as
// BPF link info reports it.
func CgroupID(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return 0, fmt.Errorf("cgroup %s: not a cgroup directory", path)
	}
	return st.Ino, nil
}

// Stats are the programs' counters, summed over CPUs.
type Stats struct {
	// Connect counts connect() calls translated to a backend (TCP and UDP).
	Connect uint64
	// Sendmsg counts unconnected UDP sends translated to a backend.
	Sendmsg uint64
	// Reverse counts recvmsg()/getpeername() addresses translated back to a service.
	Reverse uint64
	// NoBackend counts connect() and send calls refused with ECONNREFUSED.
	NoBackend uint64
	// RevNATFull counts translations whose reverse entry could not be stored.
	RevNATFull uint64
}

// Stat is one of the programs' counters: enum sk_stat.
type Stat uint32

// The counters, as bpf2go generates them; Stats says what each counts.
const (
	StatConnect    = Stat(socklbSkStatSK_STAT_CONNECT)
	StatSendmsg    = Stat(socklbSkStatSK_STAT_SENDMSG)
	StatReverse    = Stat(socklbSkStatSK_STAT_REVERSE)
	StatNoBackend  = Stat(socklbSkStatSK_STAT_NO_BACKEND)
	StatRevNATFull = Stat(socklbSkStatSK_STAT_REVNAT_FULL)
	numStats       = Stat(socklbSkStatSK_STAT_MAX)
)

// statNames names every counter in statistics; a counter of the C enum without a
// name here fails the package's tests.
var statNames = [numStats]string{
	StatConnect:    "connect",
	StatSendmsg:    "sendmsg",
	StatReverse:    "reverse",
	StatNoBackend:  "no_backend",
	StatRevNATFull: "revnat_full",
}

func (s Stat) String() string {
	if s < numStats && statNames[s] != "" {
		return statNames[s]
	}
	return fmt.Sprintf("sk_stat(%d)", uint32(s))
}

// StatCount is one counter's value.
type StatCount struct {
	Stat  Stat
	Count uint64
}

// List returns every counter, in the order of the C enum.
func (s Stats) List() []StatCount {
	return []StatCount{
		{StatConnect, s.Connect}, {StatSendmsg, s.Sendmsg}, {StatReverse, s.Reverse},
		{StatNoBackend, s.NoBackend}, {StatRevNATFull, s.RevNATFull},
	}
}

// field is the member of s that holds a counter.
func (s *Stats) field(c Stat) *uint64 {
	switch c {
	case StatConnect:
		return &s.Connect
	case StatSendmsg:
		return &s.Sendmsg
	case StatReverse:
		return &s.Reverse
	case StatNoBackend:
		return &s.NoBackend
	case StatRevNATFull:
		return &s.RevNATFull
	}
	return nil
}

// Stats reads the counters.
func (d *Datapath) Stats() (Stats, error) {
	var s Stats
	for c := range numStats {
		f := s.field(c)
		if f == nil {
			return Stats{}, fmt.Errorf("read socket-level counter %v: no field holds it", c)
		}
		var per []uint64
		if err := d.objs.SkStats.Lookup(uint32(c), &per); err != nil {
			return Stats{}, fmt.Errorf("read socket-level counter %v: %w", c, err)
		}
		for _, v := range per {
			*f += v
		}
	}
	return s, nil
}

// Translation is one translated socket's reverse entry.
type Translation struct {
	// Cookie is the socket's cookie (SO_COOKIE).
	Cookie uint64
	// Proto is lbxdp.ProtoTCP or lbxdp.ProtoUDP.
	Proto uint8
	// Service is what the application addressed; Backend is where its packets go.
	Service, Backend     netip.AddrPort
	ServiceID, BackendID uint32
	// Created is when it was translated, on the CLOCK_MONOTONIC scale of
	// lbxdp.MonotonicNow.
	Created time.Duration
}

// Translations lists the reverse entries: connected sockets, and the (socket,
// backend) pairs of unconnected UDP sockets.
func (d *Datapath) Translations() ([]Translation, error) {
	var (
		k   socklbSkRevKey
		v   socklbSkRev
		out []Translation
	)
	it := d.objs.SkRevnat.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Translation{
			Cookie:    k.Cookie,
			Proto:     k.Proto,
			Service:   netip.AddrPortFrom(addr(v.Vip, v.Family), ntohs(v.Vport)),
			Backend:   netip.AddrPortFrom(addr(k.Addr, k.Family), ntohs(k.Port)),
			ServiceID: v.ServiceId,
			BackendID: v.BackendId,
			Created:   time.Duration(v.CreatedNs),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list socket-level translations: %w", err)
	}
	return out, nil
}

// PurgeAffinity deletes the affinity entries for which drop says so, given their
// service and backend IDs, in one pass over the map: what a table change or a removed
// service leaves behind (the datapath's reconciler calls it). It returns how many it
// deleted.
func (d *Datapath) PurgeAffinity(drop func(serviceID, backendID uint32) bool) (int, error) {
	var (
		k    socklbSkAffKey
		v    socklbSkAff
		dead []socklbSkAffKey
	)
	it := d.objs.SkAffinity.Iterate()
	for it.Next(&k, &v) {
		if drop(k.ServiceId, v.BackendId) {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("list socket-level affinity: %w", err)
	}
	n := 0
	for _, k := range dead {
		err := d.objs.SkAffinity.Delete(k)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("delete socket-level affinity of service %d: %w", k.ServiceId, err)
		}
		n++
	}
	return n, nil
}

func addr(b [16]uint8, family uint8) netip.Addr {
	if family == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

func ntohs(v uint16) uint16 { return v<<8 | v>>8 }
