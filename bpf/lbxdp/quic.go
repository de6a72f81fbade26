//go:build linux

package lbxdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// QUIC holds a UDP service's QUIC-LB configuration (plaintext connection IDs,
// quic.h). The zero value leaves QUIC routing off.
type QUIC struct {
	// ConfigID is the config rotation (0-6) that the servers write into the top
	// three bits of a connection ID's first octet.
	ConfigID uint8
	// ServerIDLen is the length of the server ID that follows that octet, 1-15
	// bytes; 0: QUIC routing off.
	ServerIDLen uint8
}

// MaxQUICServerIDLen is the longest server ID (QUIC-LB allows 1-15 bytes):
// LB_QUIC_SID_MAX, which TestConstantsAsCompiled compares it with.
const MaxQUICServerIDLen = 15

// maxQUICConfigID is the highest config rotation; 0b111 marks unroutable IDs.
const maxQUICConfigID = 6

func (q QUIC) check() error {
	if q.ServerIDLen == 0 {
		return nil
	}
	if q.ServerIDLen > MaxQUICServerIDLen || q.ConfigID > maxQUICConfigID {
		return fmt.Errorf("QUIC config rotation %d, server ID length %d: %w", q.ConfigID, q.ServerIDLen, ErrRange)
	}
	return nil
}

func quicKey(serviceID uint32, sid []byte) (lbxdpLbQuicKey, error) {
	if len(sid) == 0 || len(sid) > MaxQUICServerIDLen {
		return lbxdpLbQuicKey{}, fmt.Errorf("QUIC server ID of %d bytes: %w", len(sid), ErrRange)
	}
	k := lbxdpLbQuicKey{ServiceId: serviceID}
	copy(k.Sid[:], sid)
	return k, nil
}

// SetQUICServerID routes the QUIC packets of a service whose connection ID carries sid
// to backendID. The backend must exist (UpsertBackend) before it is named here.
func (d *Datapath) SetQUICServerID(serviceID uint32, sid []byte, backendID uint32) error {
	k, err := quicKey(serviceID, sid)
	if err != nil {
		return fmt.Errorf("set QUIC server ID: %w", err)
	}
	if err := d.checkBackendID(backendID); err != nil {
		return fmt.Errorf("set QUIC server ID: %w", err)
	}
	if err := d.update(d.objs.LbQuicSids, &k, backendID, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set QUIC server ID: %w", err)
	}
	return nil
}

// DeleteQUICServerID stops routing a server ID: its packets take the 5-tuple path.
func (d *Datapath) DeleteQUICServerID(serviceID uint32, sid []byte) error {
	k, err := quicKey(serviceID, sid)
	if err != nil {
		return fmt.Errorf("delete QUIC server ID: %w", err)
	}
	if err := d.delete(d.objs.LbQuicSids, &k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete QUIC server ID: %w", err)
	}
	return nil
}

// QUICServerIDs lists the routed server IDs: by service ID, the backend ID of each
// server ID (its bytes as a string). Server IDs are read back at their service's
// configured length; without it (lens lacks the service) trailing zero bytes cannot be
// told from the ID and are kept to the full 15.
func (d *Datapath) QUICServerIDs(lens map[uint32]uint8) (map[uint32]map[string]uint32, error) {
	out := map[uint32]map[string]uint32{}
	var k lbxdpLbQuicKey
	var v uint32
	it := d.objs.LbQuicSids.Iterate()
	for it.Next(&k, &v) {
		n, ok := lens[k.ServiceId]
		if !ok || n == 0 || n > MaxQUICServerIDLen {
			n = MaxQUICServerIDLen
		}
		if out[k.ServiceId] == nil {
			out[k.ServiceId] = map[string]uint32{}
		}
		out[k.ServiceId][string(k.Sid[:n])] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list QUIC server IDs: %w", err)
	}
	return out, nil
}

// QUICRoute is how a QUIC service's packet was routed: enum lb_quic_route.
type QUICRoute uint8

// QUIC routing outcomes, as bpf2go generates them.
const (
	QUICNone      = QUICRoute(lbxdpLbQuicRouteLB_QUIC_NONE)       // not a QUIC service's packet
	QUICRouted    = QUICRoute(lbxdpLbQuicRouteLB_QUIC_ROUTED)     // by the server ID in its destination connection ID
	QUICClientCID = QUICRoute(lbxdpLbQuicRouteLB_QUIC_CLIENT_CID) // Initial, 0-RTT or unknown version: the 5-tuple, by design
	QUICUnknownID = QUICRoute(lbxdpLbQuicRouteLB_QUIC_UNKNOWN_ID) // another config rotation or a server ID no backend has: the 5-tuple
	QUICMalformed = QUICRoute(lbxdpLbQuicRouteLB_QUIC_MALFORMED)  // no connection ID of the configured form: the 5-tuple
	quicRoutes    = QUICRoute(lbxdpLbQuicRouteLB_QUIC_MAX)
)

// quicRouteNames names every route; a route of the C enum without a name here fails
// the package's tests.
var quicRouteNames = [quicRoutes]string{
	QUICNone:      "none",
	QUICRouted:    "routed_cid",
	QUICClientCID: "fallback_client_cid",
	QUICUnknownID: "fallback_unknown_id",
	QUICMalformed: "fallback_malformed",
}

func (r QUICRoute) String() string {
	if r < quicRoutes && quicRouteNames[r] != "" {
		return quicRouteNames[r]
	}
	return fmt.Sprintf("quic_route(%d)", uint8(r))
}

// QUICRouteCount is how many packets of QUIC services took one route, over all CPUs,
// since the maps were created.
type QUICRouteCount struct {
	Route QUICRoute
	Count uint64
}

// QUICRoutes reads the QUIC routing counters (all but QUICNone).
func (d *Datapath) QUICRoutes() ([]QUICRouteCount, error) {
	out := make([]QUICRouteCount, 0, quicRoutes-1)
	for r := QUICRouted; r < quicRoutes; r++ {
		n, err := sumEvents(d.objs.LbQuicStats, uint32(r))
		if err != nil {
			return nil, fmt.Errorf("read QUIC counters: %w", err)
		}
		out = append(out, QUICRouteCount{r, n})
	}
	return out, nil
}
