package store

import (
	"cmp"
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// CreateService adds a service.
func (s *Store) CreateService(in *lbdv1.Service) (*lbdv1.Service, error) {
	svc, verr := normalizeService(in, s.opts.Limits)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	if _, ok := t.services[svc.Name]; ok {
		t.abort()
		return nil, alreadyExists("service.name", "service %q already exists", svc.Name)
	}
	if err := t.checkFrontend(svc); err != nil {
		t.abort()
		return nil, err
	}
	if len(t.services) >= s.opts.Limits.MaxServices {
		t.abort()
		return nil, failedPrecondition("", "the limit of %d services is reached", s.opts.Limits.MaxServices)
	}
	t.put(svc, nil)
	if err := t.commit(); err != nil {
		return nil, err
	}
	return s.GetService(svc.Name)
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
	for _, svc := range s.services {
		if owner == "" || svc.Owner == owner {
			out = append(out, s.withStatus(svc))
		}
	}
	slices.SortFunc(out, func(a, b *lbdv1.Service) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// UpdateService replaces a service's spec. The owner cannot change; expectedRevision, if
// non-zero, must match the stored revision.
func (s *Store) UpdateService(in *lbdv1.Service, expectedRevision uint64) (*lbdv1.Service, error) {
	svc, verr := normalizeService(in, s.opts.Limits)
	if verr != nil {
		return nil, verr
	}
	t := s.begin()
	old, ok := t.services[svc.Name]
	switch {
	case !ok:
		t.abort()
		return nil, notFound("service %q not found", svc.Name)
	case expectedRevision != 0 && expectedRevision != old.Revision:
		t.abort()
		return nil, failedPrecondition("expected_revision", "service %q is at revision %d, not %d: it changed since it was read", svc.Name, old.Revision, expectedRevision)
	case svc.Owner != old.Owner:
		t.abort()
		return nil, failedPrecondition("service.owner", "service %q is owned by %q; the owner cannot be changed to %q", svc.Name, old.Owner, svc.Owner)
	}
	if err := t.checkFrontend(svc); err != nil {
		t.abort()
		return nil, err
	}
	if sameSpec(svc, old) {
		t.abort()
		return s.GetService(svc.Name)
	}
	t.put(svc, old)
	if err := t.commit(); err != nil {
		return nil, err
	}
	return s.GetService(svc.Name)
}

// DeleteService removes a service.
func (s *Store) DeleteService(name string) error {
	t := s.begin()
	old, ok := t.services[name]
	if !ok {
		t.abort()
		return notFound("service %q not found", name)
	}
	t.remove(old)
	return t.commit()
}
