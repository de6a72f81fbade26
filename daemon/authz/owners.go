package authz

import (
	"fmt"
	"slices"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// touched returns the services a writing request touches, with their owners: the owner
// it names and, for a service that exists, the owner it has (a writer can neither take
// another owner's service nor give one of its own away).
func touched(req any, lookup OwnerFunc) ([]ownerRef, error) {
	stored := func(name string) []ownerRef {
		if o, ok := lookup(name); ok {
			return []ownerRef{{service: name, owner: o}}
		}
		// A service that does not exist: the call answers NOT_FOUND and changes nothing.
		return nil
	}
	switch r := req.(type) {
	case *lbdv1.CreateServiceRequest:
		return append(stored(r.GetService().GetName()), ownerRef{service: r.GetService().GetName(), owner: r.GetService().GetOwner()}), nil
	case *lbdv1.UpdateServiceRequest:
		return append(stored(r.GetService().GetName()), ownerRef{service: r.GetService().GetName(), owner: r.GetService().GetOwner()}), nil
	case *lbdv1.DeleteServiceRequest:
		return stored(r.GetName()), nil
	case *lbdv1.ApplyServicesRequest:
		refs := []ownerRef{{owner: r.GetOwner()}}
		for _, s := range r.GetServices() {
			refs = append(refs, stored(s.GetName())...)
			if s.GetOwner() != "" {
				refs = append(refs, ownerRef{service: s.GetName(), owner: s.GetOwner()})
			}
		}
		return refs, nil
	case *lbdv1.CreateBackendRequest:
		return stored(r.GetServiceName()), nil
	case *lbdv1.UpdateBackendRequest:
		return stored(r.GetServiceName()), nil
	case *lbdv1.DeleteBackendRequest:
		return stored(r.GetServiceName()), nil
	}
	return nil, status.Errorf(codes.Internal, "authorize %T: %v", req, errUnknownRequest)
}

// operatorUpdate reports whether req is an UpdateBackend that names only the fields an
// operator may change. An empty mask replaces every field, so it is not one.
func operatorUpdate(req any) bool {
	r, ok := req.(*lbdv1.UpdateBackendRequest)
	if !ok || len(r.GetUpdateMask().GetPaths()) == 0 {
		return false
	}
	for _, p := range r.GetUpdateMask().GetPaths() {
		if !slices.Contains(operatorBackendFields, p) {
			return false
		}
	}
	return true
}

// String describes a policy for logs.
func (p *Policy) String() string {
	return fmt.Sprintf("%s (%d rules)", p.Source, len(p.rules))
}
