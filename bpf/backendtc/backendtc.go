//go:build linux

// Package backendtc loads the backend-node TC datapath and gives typed access to its
// maps.
//
// The ingress program (tcx) accepts Geneve frames carrying lbd's DSR option from
// allowed LB sources, strips them down to the inner IP packet and records a NAT entry
// (backend addr:port, client addr:port, protocol) → (VIP, port). Geneve without
// lbd's option or with another VNI belongs to another tunnel endpoint on the node
// and passes unchanged. The egress program
// rewrites the source of replies hitting such an entry to VIP:port, and rewrites ICMP
// errors about NAT'ed flows so that the client sees them come from the VIP.
//
// NAT entries are never removed by the datapath (the map is an LRU, so a full table
// evicts the stalest entry); the daemon's garbage collector removes expired ones. How
// an entry's lifetime is encoded is documented on [NATEntry].
package backendtc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// DefaultNATMaxEntries is the NAT table size when [Options.NATMaxEntries] is zero: the
// size compiled into the program (enum betc_default), as bpf2go generates it.
const DefaultNATMaxEntries = uint32(backendtcBetcDefaultBETC_DEFAULT_NAT_SIZE)

// ErrNotFound is returned by lookups of a key that is not in a map.
var ErrNotFound = errors.New("not found")

// Options control [Load].
type Options struct {
	// PinDir is a directory on a bpffs where the maps are pinned by name, or reused
	// if already pinned there (so a restarted daemon adopts the state of the previous
	// one). Empty means no pinning.
	PinDir string
	// NATMaxEntries sizes the NAT table; zero means DefaultNATMaxEntries. A pinned
	// table of another size cannot be adopted and makes Load fail.
	NATMaxEntries uint32
	// Config is written to the config map at load. When nil, DefaultConfig is written
	// unless the config map was adopted from PinDir, whose contents are then kept.
	Config *Config
}

// Datapath owns the loaded programs and maps. Closing it does not detach links
// returned by AttachIngress and AttachEgress, and leaves pinned maps in place.
type Datapath struct {
	objs backendtcObjects
}

// MapNAT is the name of the NAT map, which the daemon migrates by name; bpf2go
// generates it from the program.
const MapNAT = backendtcMapBetcNat

// Spec returns the collection Load would load for opts, map sizes applied. The daemon
// compares its maps with pinned ones to migrate a map whose size or layout changed.
func Spec(opts Options) (*ebpf.CollectionSpec, error) {
	spec, err := loadBackendtc()
	if err != nil {
		return nil, fmt.Errorf("load backendtc spec: %w", err)
	}
	n := opts.NATMaxEntries
	if n == 0 {
		n = DefaultNATMaxEntries
	}
	spec.Maps[backendtcMapBetcNat].MaxEntries = n
	return spec, nil
}

// Load loads the programs and creates (or adopts, see Options.PinDir) the maps.
func Load(opts Options) (*Datapath, error) {
	spec, err := Spec(opts)
	if err != nil {
		return nil, err
	}

	collOpts := &ebpf.CollectionOptions{}
	adopted := false
	if opts.PinDir == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	} else {
		collOpts.Maps.PinPath = opts.PinDir
		if _, err := os.Stat(filepath.Join(opts.PinDir, backendtcMapBetcConfig)); err == nil {
			adopted = true
		}
	}

	d := &Datapath{}
	if err := spec.LoadAndAssign(&d.objs, collOpts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			// The whole verifier log, not just its last line.
			return nil, fmt.Errorf("load backendtc objects: %w\n%+v", err, ve)
		}
		return nil, fmt.Errorf("load backendtc objects: %w", err)
	}

	cfg := opts.Config
	if cfg == nil && !adopted {
		def := DefaultConfig()
		cfg = &def
	}
	if cfg != nil {
		if err := d.SetConfig(*cfg); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// Close releases the programs and map handles.
func (d *Datapath) Close() error {
	if err := d.objs.Close(); err != nil {
		return fmt.Errorf("close backendtc objects: %w", err)
	}
	return nil
}

// AttachIngress attaches the decapsulating program to the ingress of the interface
// (resolved in the calling thread's network namespace) with tcx, after any program
// already there.
func (d *Datapath) AttachIngress(ifindex int) (link.Link, error) {
	l, err := link.AttachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   d.objs.LbdBeIngress,
		Attach:    ebpf.AttachTCXIngress,
	})
	if err != nil {
		return nil, fmt.Errorf("attach tcx ingress to ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

// AttachEgress attaches the SNAT program to the egress of the interface with tcx.
func (d *Datapath) AttachEgress(ifindex int) (link.Link, error) {
	l, err := link.AttachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   d.objs.LbdBeEgress,
		Attach:    ebpf.AttachTCXEgress,
	})
	if err != nil {
		return nil, fmt.Errorf("attach tcx egress to ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

// IngressProgram is the loaded ingress program (for BPF_PROG_TEST_RUN and custom
// attachment).
func (d *Datapath) IngressProgram() *ebpf.Program { return d.objs.LbdBeIngress }

// EgressProgram is the loaded egress program.
func (d *Datapath) EgressProgram() *ebpf.Program { return d.objs.LbdBeEgress }
