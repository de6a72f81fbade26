package authz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// OwnerFunc returns the owner of a stored service; false if there is no such service.
type OwnerFunc func(service string) (owner string, found bool)

// Guard authorizes the API's calls against the current policy. One Guard serves both
// listeners: the transport is known from each connection's authentication.
type Guard struct {
	policy atomic.Pointer[Policy]
	owner  OwnerFunc
	bind   BindFunc
}

// BindFunc hands a writing call's OwnerCheck to what serves it, in its context (nil
// check: the call is not limited to owners); the server must pass the check to the
// store's change.
type BindFunc func(context.Context, OwnerCheck) context.Context

// NewGuard returns a guard deciding with p; owner looks up stored services' owners,
// bind hands each writing call its owner check.
func NewGuard(p *Policy, owner OwnerFunc, bind BindFunc) *Guard {
	g := &Guard{owner: owner, bind: bind}
	g.policy.Store(p)
	return g
}

// Policy returns the policy in force.
func (g *Guard) Policy() *Policy { return g.policy.Load() }

// Swap puts p in force for the calls that start from now on.
func (g *Guard) Swap(p *Policy) { g.policy.Store(p) }

// UnaryInterceptor authorizes a unary call: gRPC's engine on the method, then the
// owner check on what the request touches.
func (g *Guard) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	p := g.policy.Load()
	id, err := p.authorize(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if err := p.checkOwners(id, info.FullMethod, req, g.owner); err != nil {
		return nil, err
	}
	if methods[info.FullMethod] == Write {
		ctx = g.bind(ctx, p.ownerCheck(id, info.FullMethod, req))
	}
	return handler(ctx, req)
}

// StreamInterceptor authorizes a streaming call (every stream only reads).
func (g *Guard) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	p := g.policy.Load()
	if _, err := p.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// authorize asks gRPC's engine of the caller's transport whether a role of the caller
// allows method.
func (p *Policy) authorize(ctx context.Context, method string) (Identity, error) {
	id, err := IdentityOf(ctx)
	if err != nil {
		return id, status.Error(codes.Unauthenticated, err.Error())
	}
	access, known := methods[method]
	if !known {
		return id, status.Errorf(codes.PermissionDenied, "%s has no authorization rule: lbd allows it to no one", method)
	}
	e := p.engines[id.Transport]
	if e == nil {
		return id, p.denied(id, method, access, fmt.Sprintf("the policy (%s) grants nothing on %s", p.Source, id.Transport))
	}
	// The engine calls the handler only when it allows; it is a no-op here, the real
	// handler runs after the owner check.
	allowed := false
	_, err = e.UnaryInterceptor(engineContext(ctx, id), nil, nil, func(context.Context, any) (any, error) {
		allowed = true
		return nil, nil
	})
	if err != nil && status.Code(err) != codes.PermissionDenied {
		return id, status.Errorf(codes.Internal, "authorize %s: %v", method, err)
	}
	if !allowed {
		return id, p.denied(id, method, access, "")
	}
	return id, nil
}

// denied is the PERMISSION_DENIED error of a call no role allows: who, what it needs,
// which roles would allow it.
func (p *Policy) denied(id Identity, method string, access Access, why string) error {
	roles := p.RolesOf(id)
	held := "no role"
	if len(roles) > 0 {
		held = "role " + strings.Join(roles, ", ")
	}
	var needed []string
	for _, r := range Roles {
		if slices.Contains(roleAccess[r], access) {
			needed = append(needed, r)
		}
	}
	msg := fmt.Sprintf("%s (%s, %s) may not call %s: it needs %s access (role %s)",
		id.Principal(), id.Transport, held, strings.TrimPrefix(method, "/"), access, strings.Join(needed, " or "))
	if why != "" {
		msg += "; " + why
	}
	return status.Error(codes.PermissionDenied, msg+"; see docs/security.md")
}

// ownerRef is a service a request touches and its owner.
type ownerRef struct {
	service, owner string
}

// OwnerCheck refuses a change to a service of an owner the caller may not change (the
// store's check, daemon/store.OwnerCheck).
type OwnerCheck = func(service, owner string) error

// writerOwners returns the owner patterns a writing call of id is limited to; nil with
// no error: the call is not limited (not a writing call, an admin, an operator's
// UpdateBackend of weight and state).
func (p *Policy) writerOwners(id Identity, method string, req any) ([]string, error) {
	if methods[method] != Write {
		return nil, nil
	}
	grants := p.grants(id)
	if slices.ContainsFunc(grants, func(r rule) bool { return r.role == RoleAdmin }) {
		return nil, nil
	}
	isOperator := slices.ContainsFunc(grants, func(r rule) bool { return r.role == RoleOperator })
	if isOperator && operatorUpdate(req) {
		return nil, nil
	}
	var owners []string
	for _, r := range grants {
		if r.role == RoleWriter {
			owners = append(owners, r.owners...)
		}
	}
	if len(owners) == 0 {
		// Only an operator gets here (the engine let no one else through): UpdateBackend
		// on other fields than weight and state.
		return nil, status.Errorf(codes.PermissionDenied, "%s (%s, role operator) may change only a backend's %s (name them in the update mask), not other fields; see docs/security.md",
			id.Principal(), id.Transport, strings.Join(operatorBackendFields, " and "))
	}
	return owners, nil
}

// ownerRefused is the PERMISSION_DENIED error of a writer's change to ref, or nil if
// one of owners matches ref's owner.
func ownerRefused(id Identity, owners []string, ref ownerRef) error {
	if slices.ContainsFunc(owners, func(o string) bool { return matchOwner(o, ref.owner) }) {
		return nil
	}
	what := fmt.Sprintf("owner %q", ref.owner)
	if ref.owner == "" {
		what = "no owner"
	}
	if ref.service != "" {
		what = fmt.Sprintf("service %q has %s", ref.service, what)
	}
	return status.Errorf(codes.PermissionDenied, "%s (%s, role writer) may change only services of owners %s; %s; see docs/security.md",
		id.Principal(), id.Transport, quoteAll(owners), what)
}

// checkOwners allows a writing call only on services of owners a writer's rule names
// (admins: any); an operator's UpdateBackend only on weight and state. It decides on
// the request and the owners stored when the call starts; ownerCheck decides again
// inside the store's change.
func (p *Policy) checkOwners(id Identity, method string, req any, lookup OwnerFunc) error {
	owners, err := p.writerOwners(id, method, req)
	if err != nil || owners == nil {
		return err
	}
	refs, err := touched(req, lookup)
	if err != nil {
		return err
	}
	for _, ref := range refs {
		if err := ownerRefused(id, owners, ref); err != nil {
			return err
		}
	}
	return nil
}

// ownerCheck returns the check the store makes of every service a writing call of id
// changes, in the transaction that changes it: no change of a service's owner between
// checkOwners and the write lets a writer touch another owner's service. Nil: the call
// is not limited to owners.
func (p *Policy) ownerCheck(id Identity, method string, req any) OwnerCheck {
	owners, err := p.writerOwners(id, method, req)
	if err != nil || owners == nil {
		return nil
	}
	return func(service, owner string) error {
		return ownerRefused(id, owners, ownerRef{service: service, owner: owner})
	}
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// errUnknownRequest: a Write method whose request the owner check does not know, which
// a test catches (TestEveryWriteHasAnOwner).
var errUnknownRequest = errors.New("no owner check for this request type")
