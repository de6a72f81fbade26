//go:build linux

// Package datapath owns the node's BPF programs: it loads them with their maps pinned
// under one bpffs directory per instance, attaches them through pinned links, adopts what
// an earlier daemon left there, and is the only writer of the maps (it implements the
// reconciler's Datapath). Closing it leaves everything forwarding; Detach removes it.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/bpf/socklb"
	"github.com/lbd-dev/lbd/daemon/gc"
	"github.com/lbd-dev/lbd/daemon/lock"
	"github.com/lbd-dev/lbd/daemon/nexthop"
	"github.com/vishvananda/netlink"
)

// Config configures the datapath of a node.
type Config struct {
	// LB and Backend select the roles.
	LB, Backend bool
	// Interfaces are the uplinks: XDP on LB nodes, TC ingress and egress on backend nodes.
	Interfaces []string
	// BPFFSDir is the instance's bpffs directory (maps and links are pinned below it).
	BPFFSDir string
	// HashSeed must be the same on every LB node.
	HashSeed uint32
	// VNI of the Geneve header.
	VNI uint32
	// Underlay4 and Underlay6 are the LB node's outer source addresses; unset, each
	// packet takes the source the kernel would use toward its backend node (the route's
	// preferred source, or the egress interface's address).
	Underlay4, Underlay6 netip.Addr
	// LBSources are the prefixes a backend node accepts Geneve from.
	LBSources []netip.Prefix
	// Map sizes.
	ConntrackSize, NATSize, MaxServices, MaxBackends uint32
	// ConntrackGuardRate is the flood guard (lbxdp.Config.GuardRate); 0 turns it off.
	ConntrackGuardRate uint32
	// GC bounds the garbage collector's interval.
	GC gc.Interval
	// TCPIdleTimeout and UDPIdleTimeout expire idle flows: LB conntrack entries after
	// them, backend NAT entries after NATIdle of them, so that a NAT entry outlives the
	// LB nodes' entry. Zero keeps the LB datapath's defaults (6 h and 60 s).
	TCPIdleTimeout, UDPIdleTimeout time.Duration
	// NATClosingTimeout expires NAT entries of closing TCP flows.
	NATClosingTimeout time.Duration
	// SocketLB attaches the socket-level programs (package socklb) to SocketCgroup (empty:
	// the root of the cgroup v2 hierarchy). They read the LB maps, which are then loaded
	// and written on any node, with XDP attached only on LB nodes.
	SocketLB         bool
	SocketCgroup     string
	SocketRevNATSize uint32
	// VerifyInterval is how often the maps and attachments are read back, compared with
	// the desired state and repaired (RunVerify); 0 takes DefaultVerifyInterval.
	VerifyInterval time.Duration
	// NeighbourRecord is the file where the LB role records the neighbour entries it
	// created for backend nodes' next hops, so a restarted lbd can remove them when they
	// are no longer needed; empty keeps the record in memory.
	NeighbourRecord string
	// MonitorSample and MonitorRate bound what the XDP program reports while a packet
	// monitor listens (lbxdp.MonitorConfig); 0 takes DefaultMonitorSample and
	// DefaultMonitorRate.
	MonitorSample, MonitorRate uint32
	// OnPaths, when set, is called with the path toward every backend node (LB role)
	// whenever one changes.
	OnPaths func(map[netip.Addr]nexthop.Path)
}

// Manager is the loaded, attached datapath of a node.
type Manager struct {
	cfg Config
	log hclog.Logger

	lb   *lbxdp.Datapath
	be   *backendtc.Datapath
	sock *socklb.Datapath

	mu       sync.Mutex
	links    map[string]link.Link  // by pin name
	attaches map[string]attachSpec // how to attach each link again
	attached bool                  // false once detached on purpose (Detach)
	synced   bool                  // the first Sync has written the desired state
	// syncedCh is closed when synced becomes true (Synced).
	syncedCh chan struct{}
	ifindex  int               // first uplink, for traces
	locks    []*lock.Held      // bpffs directory and interfaces (own.go)
	nh       *nexthop.Tracker  // LB role: next hops toward backend nodes
	drift    map[string]uint64 // repairs by kind (verify.go)
	lbConfig lbxdp.Config      // LB role: the configuration the maps must hold

	// LB role: what the maps hold, by service ID (see lb.go).
	programmed map[uint32]*programmed
	// orphans are backends found in adopted maps, until the first Sync.
	orphans map[uint32]lbxdp.Backend
	// nodes counts the backends in the maps by node; nodesChanged says that the set
	// changed since it was last handed to the next-hop tracker (nexthops.go).
	nodes        map[netip.Addr]int
	nodesChanged bool
	// verifyNext is the service ID the next periodic verification of tables starts at.
	verifyNext uint32
	// migrations are the maps Open rebuilds: copied before the programs are switched,
	// finished once they all are (migrate.go).
	migrations []*migration
	// legacyCT is the former conntrack map, until its flows are carried over (legacy.go).
	legacyCT *legacyConntrack
}

// NATIdle is how long a backend node keeps an idle flow's NAT entry when LB nodes keep
// its conntrack entry for lbIdle: a quarter longer, so that an LB node never sends a
// packet of a flow whose NAT entry is gone, nor a backend a reply it cannot rewrite.
func NATIdle(lbIdle time.Duration) time.Duration { return lbIdle + lbIdle/4 }

func (c Config) tcpIdle() time.Duration {
	if c.TCPIdleTimeout > 0 {
		return c.TCPIdleTimeout
	}
	return lbxdp.DefaultConfig().TCPEstablishedTimeout
}

func (c Config) udpIdle() time.Duration {
	if c.UDPIdleTimeout > 0 {
		return c.UDPIdleTimeout
	}
	return lbxdp.DefaultConfig().UDPTimeout
}

func (c Config) linksDir() string   { return filepath.Join(c.BPFFSDir, "links") }
func (c Config) lbDir() string      { return filepath.Join(c.BPFFSDir, "lb") }
func (c Config) backendDir() string { return filepath.Join(c.BPFFSDir, "backend") }
func (c Config) socketDir() string  { return filepath.Join(c.BPFFSDir, "socket") }

// Open loads the programs, adopting maps and links pinned by an earlier daemon (a program
// that changed replaces the old one through its pinned link, with no detach window), and
// attaches them to the interfaces.
func Open(cfg Config, log hclog.Logger) (*Manager, error) {
	if !cfg.LB && !cfg.Backend && !cfg.SocketLB {
		return nil, errors.New("datapath: no role and no socket-level load balancing")
	}
	if (cfg.LB || cfg.Backend) && len(cfg.Interfaces) == 0 {
		return nil, errors.New("datapath: no interface to attach to")
	}
	if err := ensureBPFFS(cfg.BPFFSDir); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, log: log, links: map[string]link.Link{}, attaches: map[string]attachSpec{},
		programmed: map[uint32]*programmed{}, drift: map[string]uint64{}, nodes: map[netip.Addr]int{},
		syncedCh: make(chan struct{})}
	var lockIfaces []string
	if cfg.LB || cfg.Backend {
		lockIfaces = cfg.Interfaces
	}
	if err := m.own(lockIfaces); err != nil {
		m.disown()
		return nil, err
	}
	for _, d := range []string{cfg.linksDir(), cfg.lbDir(), cfg.backendDir(), cfg.socketDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			m.disown()
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
	}
	ifaces := make([]netlink.Link, 0, len(cfg.Interfaces))
	for _, name := range cfg.Interfaces {
		l, err := netlink.LinkByName(name)
		if err != nil {
			m.disown()
			return nil, fmt.Errorf("interface %s: %w", name, err)
		}
		ifaces = append(ifaces, l)
	}
	if len(ifaces) > 0 {
		m.ifindex = ifaces[0].Attrs().Index
	}
	changed, err := cfg.applySysctls()
	if err != nil {
		m.disown()
		return nil, err
	}
	if len(changed) > 0 {
		m.log.Info("kernel settings applied", "op", "start", "changed", strings.Join(changed, ", "))
	}
	if cfg.LB || cfg.SocketLB {
		if err := m.openLB(ifaces); err != nil {
			m.Close()
			return nil, err
		}
	}
	if cfg.Backend {
		if err := m.openBackend(ifaces); err != nil {
			m.Close()
			return nil, err
		}
	}
	if err := m.openSocket(); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.finishMigrations(); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.finishLegacyConntrack(); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.removeLegacyTables(); err != nil {
		m.Close()
		return nil, err
	}
	m.attached = true
	return m, nil
}

// learnedMaps hold state only the datapath knows; all other maps are rebuilt from the
// desired state by Sync.
var learnedMaps = map[string]bool{
	lbxdp.MapConntrack4: true, lbxdp.MapConntrack6: true, lbxdp.MapAffinity: true, backendtc.MapNAT: true,
	socklb.MapRevNAT: true, socklb.MapUDPBackend: true, socklb.MapAffinity: true,
}

// loadWithMigration loads a program's maps from dir, first moving aside pinned maps that
// no longer fit spec, and copies their entries into the new maps. The old programs run
// until they are switched and may write the old maps meanwhile: finishMigrations copies
// again after the switch.
func (m *Manager) loadWithMigration(dir string, spec *ebpf.CollectionSpec, load func() error) error {
	migs, err := planMigrations(dir, spec, learnedMaps, m.log)
	if err != nil {
		return err
	}
	if err := load(); err != nil {
		return err
	}
	for _, mg := range migs {
		start := time.Now()
		s, err := mg.copy(false)
		if err != nil {
			return err
		}
		m.log.Info("map copied, old programs still attached", "op", "migrate", "map", mg.name,
			"copied", s.copied, "present", s.present, "lost", s.lost, "took", time.Since(start))
	}
	m.migrations = append(m.migrations, migs...)
	return nil
}

// finishMigrations copies what the old programs wrote into the old maps until they were
// switched, and removes the old maps' pins. Every program must be switched by then.
func (m *Manager) finishMigrations() error {
	for _, mg := range m.migrations {
		start := time.Now()
		s, err := mg.finish()
		if err != nil {
			return err
		}
		m.log.Info("map migrated", "op", "migrate", "map", mg.name, "copied", mg.total.copied, "lost", mg.total.lost,
			"copied_after_switch", s.copied, "took", time.Since(start), "layout_changed", mg.layoutChanged())
	}
	m.migrations = nil
	return nil
}

func (m *Manager) openLB(ifaces []netlink.Link) error {
	opts := lbxdp.Options{
		PinPath:       m.cfg.lbDir(),
		MaxServices:   m.cfg.MaxServices,
		MaxBackends:   m.cfg.MaxBackends,
		ConntrackSize: m.cfg.ConntrackSize,
	}
	spec, err := lbxdp.Spec(opts)
	if err != nil {
		return err
	}
	ctNew := !m.cfg.ctPinned()
	err = m.loadWithMigration(m.cfg.lbDir(), spec, func() error {
		var err error
		m.lb, err = lbxdp.Load(opts)
		if err != nil {
			return fmt.Errorf("load XDP datapath: %+v", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := m.adoptLegacyConntrack(ctNew); err != nil {
		return err
	}
	have, err := m.lb.Config()
	if err != nil {
		return err
	}
	c := have
	c.HashSeed, c.VNI = m.cfg.HashSeed, m.cfg.VNI
	c.Source4, c.Source6 = m.cfg.Underlay4, m.cfg.Underlay6
	// SCTP associations are connections like TCP's and follow its idle timeout.
	c.TCPEstablishedTimeout, c.UDPTimeout, c.SCTPEstablishedTimeout = m.cfg.tcpIdle(), m.cfg.udpIdle(), m.cfg.tcpIdle()
	c.GuardRate = m.cfg.ConntrackGuardRate
	// An adopted datapath that holds this configuration already is not written.
	if c != have {
		if err := m.lb.SetConfig(c); err != nil {
			return fmt.Errorf("configure XDP datapath: %w", err)
		}
	}
	m.lbConfig = c
	if m.cfg.LB {
		if err := m.startNextHops(); err != nil {
			return err
		}
	}
	for _, ifc := range ifaces {
		if !m.cfg.LB {
			break // the maps serve socket-level load balancing only
		}
		a := ifc.Attrs()
		err := m.attach("xdp-"+a.Name, m.lb.Program(), func() (link.Link, error) { return m.lb.Attach(a.Index) })
		if err != nil {
			return err
		}
	}
	return m.adoptProgrammed()
}

func (m *Manager) openBackend(ifaces []netlink.Link) error {
	opts := backendtc.Options{PinDir: m.cfg.backendDir(), NATMaxEntries: m.cfg.NATSize, Config: &backendtc.Config{VNI: m.cfg.VNI}}
	spec, err := backendtc.Spec(opts)
	if err != nil {
		return err
	}
	err = m.loadWithMigration(m.cfg.backendDir(), spec, func() error {
		var err error
		m.be, err = backendtc.Load(opts)
		if err != nil {
			return fmt.Errorf("load TC datapath: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := m.syncLBSources(); err != nil {
		return err
	}
	for _, ifc := range ifaces {
		a := ifc.Attrs()
		err := m.attach("tcx-ingress-"+a.Name, m.be.IngressProgram(), func() (link.Link, error) { return m.be.AttachIngress(a.Index) })
		if err != nil {
			return err
		}
		err = m.attach("tcx-egress-"+a.Name, m.be.EgressProgram(), func() (link.Link, error) { return m.be.AttachEgress(a.Index) })
		if err != nil {
			return err
		}
	}
	return nil
}

// syncLBSources makes the backend's allow list equal to the configured LB prefixes.
func (m *Manager) syncLBSources() error {
	have, err := m.be.AllowedSources()
	if err != nil {
		return fmt.Errorf("list allowed LB sources: %w", err)
	}
	want := map[netip.Prefix]bool{}
	for _, p := range m.cfg.LBSources {
		want[p.Masked()] = true
	}
	for _, p := range have {
		if !want[p] {
			if err := m.be.DeleteAllowedSource(p); err != nil {
				return fmt.Errorf("remove allowed LB source %s: %w", p, err)
			}
		}
		delete(want, p)
	}
	for p := range want {
		if err := m.be.AddAllowedSource(p); err != nil {
			return fmt.Errorf("add allowed LB source %s: %w", p, err)
		}
	}
	return nil
}

// Detach removes the programs from the interfaces and deletes every pin of the instance.
// Established flows stop being forwarded.
func (m *Manager) Detach(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	if m.nh != nil {
		// Neighbour entries lbd created for its backend nodes go with the datapath: the
		// tracker deletes those of nodes it no longer tracks.
		m.nh.SetNodes(nil)
	}
	for name, l := range m.links {
		// Detached now, not when the kernel releases the last reference.
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach %s: %w", name, err))
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", name, err))
		}
		delete(m.links, name)
	}
	for _, d := range []string{m.cfg.lbDir(), m.cfg.backendDir(), m.cfg.socketDir(), m.cfg.linksDir()} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("remove pins: %w", err))
		}
	}
	m.attached = false
	return errors.Join(errs...)
}

// DetachDir removes a datapath left pinned under dir by a daemon that is not running.
func DetachDir(dir string) error {
	var errs []error
	links := filepath.Join(dir, "links")
	entries, err := os.ReadDir(links)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", links, err)
	}
	for _, e := range entries {
		// Removing the pin drops the last reference: the kernel detaches the program.
		if err := os.Remove(filepath.Join(links, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range []string{"lb", "backend", "socket", "links"} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close releases the daemon's handles. Pinned links and maps stay: the datapath keeps
// forwarding until a new daemon adopts it.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, l := range m.links {
		errs = append(errs, l.Close())
	}
	m.links = map[string]link.Link{}
	if m.lb != nil {
		errs = append(errs, m.lb.Close())
	}
	if m.be != nil {
		errs = append(errs, m.be.Close())
	}
	if m.sock != nil {
		errs = append(errs, m.sock.Close())
	}
	errs = append(errs, m.disown())
	return errors.Join(errs...)
}
