package store

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/lbd-dev/lbd/daemon/model"
	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/proto"
)

// ApplyResult counts what ApplyServices did, and lists the changes.
type ApplyResult struct {
	Created, Updated, Deleted, Unchanged int
	// Changes are the services created, updated and deleted, sorted by name.
	Changes []*lbdv1.ServiceChange
}

// apply makes the services of owner exactly svcs, all or nothing (ApplyServices), or
// with plan only checks svcs and returns what it would do (PlanServices).
func (s *Store) apply(owner string, svcs []*lbdv1.Service, plan bool, check OwnerCheck) (ApplyResult, error) {
	return retryHeld(s, func() (ApplyResult, error) { return s.applyOnce(owner, svcs, plan, check) })
}

func (s *Store) applyOnce(owner string, svcs []*lbdv1.Service, plan bool, check OwnerCheck) (ApplyResult, error) {
	var res ApplyResult
	if owner != "" {
		if err := validateName("owner", owner); err != nil {
			return res, err
		}
	}
	want := make([]*model.Service, 0, len(svcs))
	names := make(map[string]int, len(svcs))
	fronts := make(map[frontendKey]int, len(svcs))
	for i, in := range svcs {
		if in != nil && in.Owner != "" && in.Owner != owner {
			return res, invalid(fmt.Sprintf("services[%d].owner", i), "%q differs from the applying owner %q", in.Owner, owner)
		}
		svc, verr := normalizeService(in, s.opts.Limits)
		if verr != nil {
			verr.Field = fmt.Sprintf("services[%d]", i) + verr.Field[len("service"):]
			return res, verr
		}
		svc.Spec.Owner = owner
		if j, dup := names[svc.Spec.Name]; dup {
			return res, invalid(fmt.Sprintf("services[%d].name", i), "duplicate name %q (also services[%d])", svc.Spec.Name, j)
		}
		names[svc.Spec.Name] = i
		fk := frontendOf(svc)
		if j, dup := fronts[fk]; dup {
			return res, invalid(fmt.Sprintf("services[%d].vip", i), "duplicate frontend %s (also services[%d])", fk, j)
		}
		fronts[fk] = i
		want = append(want, svc)
	}
	t := s.beginAs(check)
	for i, svc := range want {
		if old := t.service(svc.Spec.Name); old != nil && old.Spec.Owner != owner {
			t.abort()
			return res, failedPrecondition(fmt.Sprintf("services[%d].name", i), "service %q is owned by %q, not %q", svc.Spec.Name, old.Spec.Owner, owner)
		}
		if other, ok := t.frontend(frontendOf(svc)); ok && t.service(other).Spec.Owner != owner {
			t.abort()
			return res, alreadyExists(fmt.Sprintf("services[%d].vip", i), "frontend %s is already used by service %q of owner %q", frontendOf(svc), other, t.service(other).Spec.Owner)
		}
	}
	// Deletions first, so a frontend may move from one of the owner's services to another.
	// The transaction has changed nothing yet: the store's names are its names.
	for _, name := range s.names {
		old := s.services[name]
		if _, keep := names[name]; old.Spec.Owner == owner && !keep {
			t.remove(old)
			res.Deleted++
			res.Changes = append(res.Changes, &lbdv1.ServiceChange{Name: name, Type: lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_DELETED, Before: specOnly(old.Spec)})
		}
	}
	changed := make([]bool, len(want))
	for i, svc := range want {
		old := t.service(svc.Spec.Name)
		if old != nil && sameSpec(svc, old) {
			res.Unchanged++
			continue
		}
		changed[i] = true
		if old != nil {
			t.freeFrontend(frontendOf(old), old.Spec.Name)
		}
	}
	for i, svc := range want {
		if !changed[i] {
			continue
		}
		old := t.service(svc.Spec.Name)
		if other, ok := t.frontend(frontendOf(svc)); ok && other != svc.Spec.Name {
			t.abort()
			return ApplyResult{}, alreadyExists("services.vip", "frontend %s is already used by service %q", frontendOf(svc), other)
		}
		t.put(svc, old)
		change := &lbdv1.ServiceChange{Name: svc.Spec.Name, Type: lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_CREATED, After: specOnly(svc.Spec)}
		if old == nil {
			res.Created++
		} else {
			res.Updated++
			change.Type, change.Before = lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_UPDATED, specOnly(old.Spec)
		}
		res.Changes = append(res.Changes, change)
	}
	slices.SortFunc(res.Changes, func(a, b *lbdv1.ServiceChange) int { return cmp.Compare(a.Name, b.Name) })
	if t.nsvc > s.opts.Limits.MaxServices {
		t.abort()
		return ApplyResult{}, failedPrecondition("services", "%d services would exceed the limit of %d", t.nsvc, s.opts.Limits.MaxServices)
	}
	if len(t.events) == 0 {
		t.abort()
		return res, nil
	}
	if plan {
		err := t.checkOwners()
		if err == nil {
			err = t.checkLimits()
		}
		t.abort()
		if err != nil {
			return ApplyResult{}, err
		}
		return res, nil
	}
	if err := t.commit(); err != nil {
		return ApplyResult{}, err
	}
	return res, nil
}

// specOnly is a copy of a stored service without what the store and the datapath add
// to the spec: IDs, revision, status, and the backends' output-only fields.
func specOnly(svc *lbdv1.Service) *lbdv1.Service {
	out := proto.Clone(svc).(*lbdv1.Service)
	out.Id, out.Revision, out.Status = 0, 0, nil
	for _, b := range out.Backends {
		b.Id, b.Health, b.TableSlots, b.NodeReachability = 0, nil, 0, lbdv1.Reachability_REACHABILITY_UNSPECIFIED
	}
	return out
}
