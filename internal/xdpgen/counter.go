//go:build linux

package xdpgen

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/lbd-dev/lbd/internal/testnet"
)

// Counter counts the IPv4 TCP and UDP frames an interface receives, in an XDP program
// in native mode, and drops or passes them; every other frame (ARP, ICMP, IPv6) passes,
// so that the interface keeps working as a host's. Attached to the peer of the
// injector's veth, it is also the XDP program that the veth needs to transmit.
type Counter struct {
	prog     *ebpf.Program
	counters *ebpf.Map
	cfg      *ebpf.Map
	arrived  *ebpf.Map
	link     link.Link
}

// Count attaches a Counter to ifname in ns. drop drops the counted frames; otherwise
// they go on to the kernel (to be captured, or forwarded).
func Count(ns *testnet.NS, ifname string, drop bool) (*Counter, error) {
	return count(ns, ifname, drop, nil)
}

func count(ns *testnet.NS, ifname string, drop bool, p *Pacer) (*Counter, error) {
	spec, err := loadXdpgen()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Prog     *ebpf.Program `ebpf:"xg_count"`
		Counters *ebpf.Map     `ebpf:"xg_counters"`
		Cfg      *ebpf.Map     `ebpf:"xg_count_cfg"`
		Arrived  *ebpf.Map     `ebpf:"xg_arrived"`
	}
	if err := spec.LoadAndAssign(&objs, p.replacements()); err != nil {
		return nil, fmt.Errorf("xdpgen: load counter: %w", err)
	}
	c := &Counter{prog: objs.Prog, counters: objs.Counters, cfg: objs.Cfg, arrived: objs.Arrived}
	verdict := uint32(2) // XDP_PASS
	if drop {
		verdict = 1 // XDP_DROP
	}
	if err := c.cfg.Put(uint32(0), verdict); err != nil {
		c.Close()
		return nil, fmt.Errorf("xdpgen: configure counter: %w", err)
	}
	err = ns.DoErr(func() error {
		ifc, err := netInterface(ifname)
		if err != nil {
			return err
		}
		c.link, err = link.AttachXDP(link.XDPOptions{Program: c.prog, Interface: ifc, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("xdpgen: attach counter to %s in %s: %w", ifname, ns.Name, err)
	}
	return c, nil
}

// Packets returns the frames counted so far and their bytes.
func (c *Counter) Packets() (packets, bytes uint64, err error) {
	var per []xdpgenXgCounts
	if err := c.counters.Lookup(uint32(0), &per); err != nil {
		return 0, 0, fmt.Errorf("xdpgen: read counter: %w", err)
	}
	for _, v := range per {
		packets += v.Packets
		bytes += v.Bytes
	}
	return packets, bytes, nil
}

// Close detaches and unloads the counter.
func (c *Counter) Close() error {
	var errs []error
	if c.link != nil {
		errs = append(errs, c.link.Close())
	}
	return errors.Join(append(errs, c.prog.Close(), c.counters.Close(), c.cfg.Close(), c.arrived.Close())...)
}
