package store

import (
	"maps"
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// OwnerCheck refuses a change to a service of an owner that the caller may not change.
// It is called inside the change's transaction, holding the store's write lock, for
// each service the change touches: with the owner the service has before the change,
// and with the one it has after. An error refuses the whole change and is returned as
// it is.
type OwnerCheck = func(service, owner string) error

// Writer makes changes as one caller: each passes the caller's OwnerCheck where the
// change is decided, so that no concurrent change of a service's owner can come between
// the check and the write.
type Writer struct {
	s     *Store
	check OwnerCheck
}

// As returns a writer whose changes check; nil checks nothing.
func (s *Store) As(check OwnerCheck) Writer { return Writer{s: s, check: check} }

// beginAs begins a transaction whose commit calls check.
func (s *Store) beginAs(check OwnerCheck) *txn {
	t := s.begin()
	t.check = check
	return t
}

// checkOwners calls the transaction's owner check on every service it changes, before
// and after, in name order.
func (t *txn) checkOwners() error {
	if t.check == nil {
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(t.svcs)) {
		if old := t.s.services[name]; old != nil {
			if err := t.check(name, old.Spec.Owner); err != nil {
				return err
			}
		}
		if svc := t.svcs[name]; svc != nil {
			if err := t.check(name, svc.Spec.Owner); err != nil {
				return err
			}
		}
	}
	return nil
}

// CreateService adds a service.
func (s *Store) CreateService(in *lbdv1.Service) (*lbdv1.Service, error) {
	return s.createService(in, nil)
}

// CreateService is Store.CreateService, checked.
func (w Writer) CreateService(in *lbdv1.Service) (*lbdv1.Service, error) {
	return w.s.createService(in, w.check)
}

// UpdateService replaces a service's spec. The owner cannot change; expectedRevision, if
// non-zero, must match the stored revision.
func (s *Store) UpdateService(in *lbdv1.Service, expectedRevision uint64) (*lbdv1.Service, error) {
	return s.updateService(in, expectedRevision, nil)
}

// UpdateService is Store.UpdateService, checked.
func (w Writer) UpdateService(in *lbdv1.Service, expectedRevision uint64) (*lbdv1.Service, error) {
	return w.s.updateService(in, expectedRevision, w.check)
}

// DeleteService removes a service.
func (s *Store) DeleteService(name string) error { return s.deleteService(name, nil) }

// DeleteService is Store.DeleteService, checked.
func (w Writer) DeleteService(name string) error { return w.s.deleteService(name, w.check) }

// ApplyServices makes the services of owner exactly svcs, all or nothing. Services of
// other owners are never touched; a name or frontend they use is a conflict. The empty
// owner is that of the services created one by one.
func (s *Store) ApplyServices(owner string, svcs []*lbdv1.Service) (ApplyResult, error) {
	return s.apply(owner, svcs, false, nil)
}

// ApplyServices is Store.ApplyServices, checked.
func (w Writer) ApplyServices(owner string, svcs []*lbdv1.Service) (ApplyResult, error) {
	return w.s.apply(owner, svcs, false, w.check)
}

// PlanServices is ApplyServices without the change: it checks svcs as ApplyServices
// would and returns what it would do.
func (s *Store) PlanServices(owner string, svcs []*lbdv1.Service) (ApplyResult, error) {
	return s.apply(owner, svcs, true, nil)
}

// PlanServices is Store.PlanServices, checked.
func (w Writer) PlanServices(owner string, svcs []*lbdv1.Service) (ApplyResult, error) {
	return w.s.apply(owner, svcs, true, w.check)
}

// CreateBackend adds a backend to a service.
func (s *Store) CreateBackend(serviceName string, in *lbdv1.Backend) (*lbdv1.Backend, error) {
	return s.createBackend(serviceName, in, nil)
}

// CreateBackend is Store.CreateBackend, checked.
func (w Writer) CreateBackend(serviceName string, in *lbdv1.Backend) (*lbdv1.Backend, error) {
	return w.s.createBackend(serviceName, in, w.check)
}

// UpdateBackendFields replaces the fields u names of a backend, keeping the others as
// stored, if the backend is in one of u.FromStates (when given); the state is checked
// and the change made in one transaction.
func (s *Store) UpdateBackendFields(serviceName string, in *lbdv1.Backend, u BackendUpdate) (*lbdv1.Backend, error) {
	return s.updateBackendFields(serviceName, in, u, nil)
}

// UpdateBackendFields is Store.UpdateBackendFields, checked.
func (w Writer) UpdateBackendFields(serviceName string, in *lbdv1.Backend, u BackendUpdate) (*lbdv1.Backend, error) {
	return w.s.updateBackendFields(serviceName, in, u, w.check)
}

// DeleteBackend removes a backend from a service.
func (s *Store) DeleteBackend(serviceName, address string, port uint32) error {
	return s.deleteBackend(serviceName, address, port, nil)
}

// DeleteBackend is Store.DeleteBackend, checked.
func (w Writer) DeleteBackend(serviceName, address string, port uint32) error {
	return w.s.deleteBackend(serviceName, address, port, w.check)
}
