package store

import (
	"slices"

	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// createService adds a service.
func (s *Store) createService(in *lbdv1.Service, check OwnerCheck) (*lbdv1.Service, error) {
	return retryHeld(s, func() (*lbdv1.Service, error) { return s.createServiceOnce(in, check) })
}

func (s *Store) createServiceOnce(in *lbdv1.Service, check OwnerCheck) (*lbdv1.Service, error) {
	svc, verr := normalizeService(in, s.opts.Limits)
	if verr != nil {
		return nil, verr
	}
	t := s.beginAs(check)
	if t.service(svc.Spec.Name) != nil {
		t.abort()
		return nil, alreadyExists("service.name", "service %q already exists", svc.Spec.Name)
	}
	if err := t.checkFrontend(svc); err != nil {
		t.abort()
		return nil, err
	}
	if t.nsvc >= s.opts.Limits.MaxServices {
		t.abort()
		return nil, failedPrecondition("", "the limit of %d services is reached", s.opts.Limits.MaxServices)
	}
	t.put(svc, nil)
	if err := t.commit(); err != nil {
		return nil, err
	}
	return s.committed(svc), nil
}

// committed returns a copy of svc, which a transaction of the caller has just stored,
// with its status: what the call stored, even if another call has changed or removed
// the service since (reading it again by name could then miss what the call changed).
func (s *Store) committed(svc *model.Service) *lbdv1.Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.withStatus(svc)
}

// GetService returns a copy of a service with its status.
func (s *Store) GetService(name string) (*lbdv1.Service, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, ok := s.services[name]
	if !ok {
		return nil, notFound("service %q not found", name)
	}
	return s.withStatus(svc), nil
}

// ListServices returns copies of all services (of owner, if non-empty) sorted by name.
func (s *Store) ListServices(owner string) []*lbdv1.Service {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lbdv1.Service, 0, len(s.services))
	for _, name := range s.names {
		if svc := s.services[name]; owner == "" || svc.Spec.Owner == owner {
			out = append(out, s.withStatus(svc))
		}
	}
	return out
}

// ListServicesPage returns, in name order, up to limit services (of owner, if
// non-empty; all for a negative limit) whose names sort after after, and whether more
// follow. A page costs what it returns, whatever the number of services.
func (s *Store) ListServicesPage(owner, after string, limit int) ([]*lbdv1.Service, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, found := slices.BinarySearch(s.names, after)
	if found {
		i++
	}
	n := len(s.names) - i
	if limit >= 0 {
		n = min(n, limit)
	}
	out := make([]*lbdv1.Service, 0, n)
	for ; i < len(s.names); i++ {
		svc := s.services[s.names[i]]
		if owner != "" && svc.Spec.Owner != owner {
			continue
		}
		if len(out) == limit {
			return out, true
		}
		out = append(out, s.withStatus(svc))
	}
	return out, false
}

// updateService replaces a service's spec. The owner cannot change; expectedRevision, if
// non-zero, must match the stored revision.
func (s *Store) updateService(in *lbdv1.Service, expectedRevision uint64, check OwnerCheck) (*lbdv1.Service, error) {
	return retryHeld(s, func() (*lbdv1.Service, error) { return s.updateServiceOnce(in, expectedRevision, check) })
}

func (s *Store) updateServiceOnce(in *lbdv1.Service, expectedRevision uint64, check OwnerCheck) (*lbdv1.Service, error) {
	svc, verr := normalizeService(in, s.opts.Limits)
	if verr != nil {
		return nil, verr
	}
	t := s.beginAs(check)
	name := svc.Spec.Name
	old := t.service(name)
	ok := old != nil
	switch {
	case !ok:
		t.abort()
		return nil, notFound("service %q not found", name)
	case expectedRevision != 0 && expectedRevision != old.Spec.Revision:
		t.abort()
		return nil, failedPrecondition("expected_revision", "service %q is at revision %d, not %d: it changed since it was read", name, old.Spec.Revision, expectedRevision)
	case svc.Spec.Owner != old.Spec.Owner:
		t.abort()
		return nil, failedPrecondition("service.owner", "service %q is owned by %q; the owner cannot be changed to %q", name, old.Spec.Owner, svc.Spec.Owner)
	}
	if err := t.checkFrontend(svc); err != nil {
		t.abort()
		return nil, err
	}
	if sameSpec(svc, old) {
		t.abort()
		return s.GetService(name)
	}
	t.put(svc, old)
	if err := t.commit(); err != nil {
		return nil, err
	}
	return s.committed(svc), nil
}

// deleteService removes a service.
func (s *Store) deleteService(name string, check OwnerCheck) error {
	t := s.beginAs(check)
	old := t.service(name)
	if old == nil {
		t.abort()
		return notFound("service %q not found", name)
	}
	t.remove(old)
	return t.commit()
}
