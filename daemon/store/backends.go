package store

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/lbd-dev/lbd/daemon/maglev"
	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// editBackends runs edit on a copy of a service (its message and addresses) and stores
// the result. It returns the service as stored, with its status.
func (s *Store) editBackends(serviceName string, check OwnerCheck, edit func(svc *model.Service) error) (*model.Service, error) {
	t := s.beginAs(check)
	old := t.service(serviceName)
	if old == nil {
		t.abort()
		return nil, notFound("service %q not found", serviceName)
	}
	svc := old.WithSpec(proto.Clone(old.Spec).(*lbdv1.Service))
	svc.Backends = slices.Clone(old.Backends)
	if err := edit(svc); err != nil {
		t.abort()
		return nil, err
	}
	spec := svc.Spec
	if len(spec.Backends) > s.opts.Limits.MaxBackendsPerService {
		t.abort()
		return nil, failedPrecondition("backend", "service %q would have %d backends, over the limit of %d", serviceName, len(spec.Backends), s.opts.Limits.MaxBackendsPerService)
	}
	if _, j, dup := duplicateQUICServerID(spec.Backends); dup {
		t.abort()
		return nil, invalid("backend.quic_server_id", "%x is already the server ID of another backend of service %q", spec.Backends[j].QuicServerId, serviceName)
	}
	var weights uint32
	for _, b := range spec.Backends {
		weights += b.Weight
	}
	if m := maglev.TableSize(spec.MaglevTableSize, len(spec.Backends), uint64(weights)); weights > m {
		t.abort()
		return nil, invalid("backend.weight", "weights would add up to %d, more than the Maglev table size %d", weights, m)
	}
	sortBackends(svc)
	if sameSpec(svc, old) {
		t.abort()
		return s.typedService(serviceName)
	}
	t.put(svc, old)
	if err := t.commit(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.typedWithStatus(svc), nil
}

// typedService is the service named name with its status and addresses.
func (s *Store) typedService(name string) (*model.Service, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, ok := s.services[name]
	if !ok {
		return nil, notFound("service %q not found", name)
	}
	return s.typedWithStatus(svc), nil
}

func findBackend(svc *model.Service, k netip.AddrPort) int {
	return slices.IndexFunc(svc.Backends, func(b model.Backend) bool { return b.Addr == k })
}

// createBackend adds a backend to a service.
func (s *Store) createBackend(serviceName string, in *lbdv1.Backend, check OwnerCheck) (*lbdv1.Backend, error) {
	return retryHeld(s, func() (*lbdv1.Backend, error) { return s.createBackendOnce(serviceName, in, check) })
}

func (s *Store) createBackendOnce(serviceName string, in *lbdv1.Backend, check OwnerCheck) (*lbdv1.Backend, error) {
	var key netip.AddrPort
	svc, err := s.editBackends(serviceName, check, func(svc *model.Service) error {
		b, addrs, verr := normalizeBackend("backend", in, svc.VIP, svc.Spec)
		if verr != nil {
			return verr
		}
		key = addrs.Addr
		if findBackend(svc, key) >= 0 {
			return alreadyExists("backend.address", "backend %s already exists in service %q", key, serviceName)
		}
		svc.Spec.Backends = append(svc.Spec.Backends, b)
		svc.Backends = append(svc.Backends, addrs)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return svc.Spec.Backends[findBackend(svc, key)], nil
}

// GetBackend returns one backend of a service.
func (s *Store) GetBackend(serviceName, address string, port uint32) (*lbdv1.Backend, error) {
	key, err := parseBackendRef(address, port)
	if err != nil {
		return nil, err
	}
	svc, err := s.typedService(serviceName)
	if err != nil {
		return nil, err
	}
	i := findBackend(svc, key)
	if i < 0 {
		return nil, notFound("backend %s not found in service %q", key, serviceName)
	}
	return svc.Spec.Backends[i], nil
}

// UpdateBackend replaces a backend's node address, weight and state.
func (s *Store) UpdateBackend(serviceName string, in *lbdv1.Backend) (*lbdv1.Backend, error) {
	return s.UpdateBackendFields(serviceName, in, BackendUpdate{})
}

// BackendUpdate says what UpdateBackendFields replaces, and on which conditions.
type BackendUpdate struct {
	// Fields are the fields replaced: node_address, weight, state, quic_server_id; none:
	// all of them.
	Fields []string
	// FromStates, if not empty, are the states the backend must be in.
	FromStates []lbdv1.BackendState
}

// updateBackendFields replaces the fields u names of a backend, keeping the others as
// stored, if the backend is in one of u.FromStates (when given); the state is checked
// and the change made in one transaction.
func (s *Store) updateBackendFields(serviceName string, in *lbdv1.Backend, u BackendUpdate, check OwnerCheck) (*lbdv1.Backend, error) {
	return retryHeld(s, func() (*lbdv1.Backend, error) { return s.updateBackendFieldsOnce(serviceName, in, u, check) })
}

func (s *Store) updateBackendFieldsOnce(serviceName string, in *lbdv1.Backend, u BackendUpdate, check OwnerCheck) (*lbdv1.Backend, error) {
	if in == nil {
		return nil, invalid("backend", "is required")
	}
	fields := u.Fields
	for _, f := range fields {
		if !slices.Contains(updatableBackendFields, f) {
			return nil, invalid("update_mask", "%q is not one of %s", f, strings.Join(updatableBackendFields, ", "))
		}
	}
	if slices.Contains(fields, "weight") && in.Weight == 0 {
		// Elsewhere 0 means the default weight, 1; asked for by name, a weight of 0 is
		// taken for "no new flows", which is what draining does.
		return nil, invalid("backend.weight", "0 is not a weight (1-%d); to send a backend no new flows, drain it (state DRAINING)", maglev.MaxWeight)
	}
	key, err := parseBackendRef(in.Address, in.Port)
	if err != nil {
		return nil, err
	}
	svc, err := s.editBackends(serviceName, check, func(svc *model.Service) error {
		i := findBackend(svc, key)
		if i < 0 {
			return notFound("backend %s not found in service %q", key, serviceName)
		}
		if st := svc.Spec.Backends[i].State; len(u.FromStates) > 0 && !slices.Contains(u.FromStates, st) {
			return failedPrecondition("only_from_states", "backend %s of service %q is %s, not one of %v", key, serviceName, st, u.FromStates)
		}
		merged := in
		if len(fields) > 0 {
			// Only the named fields come from in; the rest stay as stored.
			merged = proto.Clone(svc.Spec.Backends[i]).(*lbdv1.Backend)
			for _, f := range fields {
				switch f {
				case "node_address":
					merged.NodeAddress = in.NodeAddress
				case "weight":
					merged.Weight = in.Weight
				case "state":
					merged.State = in.State
				case "quic_server_id":
					merged.QuicServerId = in.QuicServerId
				}
			}
		}
		b, addrs, verr := normalizeBackend("backend", merged, svc.VIP, svc.Spec)
		if verr != nil {
			return verr
		}
		svc.Spec.Backends[i], svc.Backends[i] = b, addrs
		return nil
	})
	if err != nil {
		return nil, err
	}
	return svc.Spec.Backends[findBackend(svc, key)], nil
}

// updatableBackendFields are the fields UpdateBackend may be asked to replace alone.
var updatableBackendFields = []string{"node_address", "weight", "state", "quic_server_id"}

// deleteBackend removes a backend from a service.
func (s *Store) deleteBackend(serviceName, address string, port uint32, check OwnerCheck) error {
	key, err := parseBackendRef(address, port)
	if err != nil {
		return err
	}
	_, err = s.editBackends(serviceName, check, func(svc *model.Service) error {
		i := findBackend(svc, key)
		if i < 0 {
			return notFound("backend %s not found in service %q", key, serviceName)
		}
		svc.Spec.Backends = slices.Delete(svc.Spec.Backends, i, i+1)
		svc.Backends = slices.Delete(svc.Backends, i, i+1)
		return nil
	})
	return err
}
