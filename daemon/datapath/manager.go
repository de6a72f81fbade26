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
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/hashicorp/go-hclog"
	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/bpf/socklb"
	"github.com/lbd-dev/lbd/daemon/gc"
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
	// Underlay4 and Underlay6 are the LB node's outer source addresses; unset, the
	// first address of the first interface of that family is used.
	Underlay4, Underlay6 netip.Addr
	// LBSources are the prefixes a backend node accepts Geneve from.
	LBSources []netip.Prefix
	// Map sizes.
	ConntrackSize, NATSize, MaxServices, MaxBackends uint32
	// GC bounds the garbage collector's interval.
	GC gc.Interval
	// NATIdleTimeout and NATClosingTimeout expire NAT entries on backend nodes.
	NATIdleTimeout, NATClosingTimeout time.Duration
	// SocketLB attaches the socket-level programs (package socklb) to SocketCgroup (empty:
	// the root of the cgroup v2 hierarchy). They read the LB maps, which are then loaded
	// and written on any node, with XDP attached only on LB nodes.
	SocketLB         bool
	SocketCgroup     string
	SocketRevNATSize uint32
}

// Manager is the loaded, attached datapath of a node.
type Manager struct {
	cfg Config
	log hclog.Logger

	lb   *lbxdp.Datapath
	be   *backendtc.Datapath
	sock *socklb.Datapath

	mu       sync.Mutex
	links    map[string]link.Link // by pin name
	attached bool
	ifindex  int // first uplink, for traces

	// LB role: what the maps hold, by service ID (see lb.go).
	programmed map[uint32]*programmed
	// orphans are backends found in adopted maps, until the first Sync.
	orphans map[uint32]lbxdp.Backend
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
	for _, d := range []string{cfg.linksDir(), cfg.lbDir(), cfg.backendDir(), cfg.socketDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
	}
	m := &Manager{cfg: cfg, log: log, links: map[string]link.Link{}, programmed: map[uint32]*programmed{}}
	ifaces := make([]netlink.Link, 0, len(cfg.Interfaces))
	for _, name := range cfg.Interfaces {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", name, err)
		}
		ifaces = append(ifaces, l)
	}
	if len(ifaces) > 0 {
		m.ifindex = ifaces[0].Attrs().Index
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
	m.attached = true
	return m, nil
}

// learnedMaps hold state only the datapath knows; all other maps are rebuilt from the
// desired state by Sync.
var learnedMaps = map[string]bool{
	"lb_conntrack": true, "lb_affinity": true, "betc_nat": true,
	"sk_revnat": true, "sk_udp_backend": true, "sk_affinity": true,
}

// loadWithMigration loads a program's maps from dir, first moving aside pinned maps that
// no longer fit spec; their entries are then copied into the new maps.
func (m *Manager) loadWithMigration(dir string, spec *ebpf.CollectionSpec, load func() error) error {
	migs, err := planMigrations(dir, spec, learnedMaps)
	if err != nil {
		return err
	}
	if err := load(); err != nil {
		return err
	}
	for _, mg := range migs {
		copied, lost, err := mg.finish()
		if err != nil {
			return err
		}
		m.log.Info("map migrated", "op", "migrate", "map", mg.name, "copied", copied, "lost", lost, "layout_changed", !mg.copyable)
	}
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
	c, err := m.lb.Config()
	if err != nil {
		return err
	}
	c.HashSeed, c.VNI = m.cfg.HashSeed, m.cfg.VNI
	c.Source4, c.Source6 = m.cfg.Underlay4, m.cfg.Underlay6
	if len(ifaces) > 0 && (!c.Source4.IsValid() || !c.Source6.IsValid()) {
		a4, a6 := firstAddrs(ifaces[0])
		if !c.Source4.IsValid() {
			c.Source4 = a4
		}
		if !c.Source6.IsValid() {
			c.Source6 = a6
		}
	}
	if err := m.lb.SetConfig(c); err != nil {
		return fmt.Errorf("configure XDP datapath: %w", err)
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

// attach adopts the link pinned under name, pointing it at prog (an atomic replacement
// when the program changed), or attaches anew and pins the link.
func (m *Manager) attach(name string, prog *ebpf.Program, attachNew func() (link.Link, error)) error {
	path := filepath.Join(m.cfg.linksDir(), name)
	l, err := link.LoadPinnedLink(path, nil)
	switch {
	case err == nil:
		if err := l.Update(prog); err != nil {
			l.Close()
			return fmt.Errorf("replace program of pinned link %s: %w", name, err)
		}
		m.log.Info("adopted pinned link", "op", "attach", "link", name)
	case errors.Is(err, fs.ErrNotExist):
		if l, err = attachNew(); err != nil {
			return err
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return fmt.Errorf("pin link %s: %w", name, err)
		}
		m.log.Info("attached", "op", "attach", "link", name)
	default:
		return fmt.Errorf("open pinned link %s: %w", name, err)
	}
	m.links[name] = l
	return nil
}

// Attached reports whether the programs are attached.
func (m *Manager) Attached() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.attached
}

// Detach removes the programs from the interfaces and deletes every pin of the instance.
// Established flows stop being forwarded.
func (m *Manager) Detach(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for name, l := range m.links {
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
	return errors.Join(errs...)
}

// firstAddrs returns the first IPv4 and global IPv6 address of an interface.
func firstAddrs(l netlink.Link) (v4, v6 netip.Addr) {
	addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		switch {
		case ip.Is4() && !v4.IsValid():
			v4 = ip
		case ip.Is6() && !ip.IsLinkLocalUnicast() && !v6.IsValid():
			v6 = ip
		}
	}
	return v4, v6
}
