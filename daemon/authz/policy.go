package authz

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/authz"
	"sigs.k8s.io/yaml"
)

// File is the policy file an operator writes (YAML). Rules only allow: whoever no rule
// names is denied, on TCP entirely; on the Unix socket root and lbd's own user are
// always admin.
type File struct {
	// Rules bind principals to a role. A principal named by several rules holds all
	// their roles.
	Rules []Rule `json:"rules"`
}

// Rule gives a role to principals.
type Rule struct {
	// Role is reader, operator, writer or admin.
	Role string `json:"role"`
	// Principals match TCP clients by their certificate, as gRPC's authorization policy
	// does: its URI SANs if it has any, else its DNS SANs, else its subject
	// ("CN=name,O=org"). "*" matches any client, "prefix*" and "*suffix" a part.
	Principals []string `json:"principals,omitempty"`
	// UnixUsers match Unix socket clients by user name or uid.
	UnixUsers []string `json:"unix_users,omitempty"`
	// UnixGroups match Unix socket clients by a group, primary or supplementary, by
	// name or gid. The socket's mode and group (api.socket_mode, api.socket_group)
	// decide who can connect at all.
	UnixGroups []string `json:"unix_groups,omitempty"`
	// Owners limit a writer to the services of these owners: an exact owner, "k8s/*"
	// for a prefix, "*" for every owner, "" for services without one. Required for
	// writers, refused for the other roles.
	Owners []string `json:"owners,omitempty"`
}

// Transport is how a client reached the API.
type Transport string

// Transports.
const (
	TransportUnix Transport = "unix"
	TransportTCP  Transport = "tcp"
)

// rule is a compiled rule: its principals are patterns over an Identity's names.
type rule struct {
	name       string
	role       string
	transport  Transport
	principals []string
	owners     []string
}

// Policy is a compiled policy: one gRPC authorization engine per transport, and the
// rules for the owner check.
type Policy struct {
	// Source is the policy file, or "built-in" without one.
	Source string
	// Digest is the SHA-256 of the file's content (empty for the built-in policy).
	Digest  string
	rules   []rule
	engines map[Transport]*authz.StaticInterceptor
}

// Builtin is the Source of the policy lbd runs without a policy file.
const Builtin = "built-in"

// Load reads, validates and compiles the policy file at path; an empty path gives the
// built-in policy. self is the uid lbd runs as, admin on the socket like root.
func Load(path string, self uint32) (*Policy, error) {
	var f File
	digest := ""
	source := Builtin
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read policy: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &f); err != nil {
			return nil, fmt.Errorf("policy %s: %w", path, err)
		}
		sum := sha256.Sum256(data)
		digest, source = hex.EncodeToString(sum[:]), path
	}
	p, err := compile(f, self)
	if err != nil {
		if path != "" {
			return nil, fmt.Errorf("policy %s: %w", path, err)
		}
		return nil, err
	}
	p.Source, p.Digest = source, digest
	return p, nil
}

// compile validates f and builds its engines. Every error names the field.
func compile(f File, self uint32) (*Policy, error) {
	p := &Policy{engines: map[Transport]*authz.StaticInterceptor{}}
	// Root and lbd's own user can read and replace the state file anyway.
	builtin := []string{"unix:uid:0"}
	if self != 0 {
		builtin = append(builtin, "unix:uid:"+strconv.FormatUint(uint64(self), 10))
	}
	p.rules = append(p.rules, rule{name: "builtin-root", role: RoleAdmin, transport: TransportUnix, principals: builtin})
	var errs []error
	for i, r := range f.Rules {
		rs, err := compileRule(i, r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.rules = append(p.rules, rs...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, t := range []Transport{TransportUnix, TransportTCP} {
		e, err := engine(t, p.rules)
		if err != nil {
			return nil, err
		}
		if e != nil {
			p.engines[t] = e
		}
	}
	return p, nil
}

func compileRule(i int, r Rule) ([]rule, error) {
	field := func(name string, j int) string { return fmt.Sprintf("rules[%d].%s[%d]", i, name, j) }
	var errs []error
	if !slices.Contains(Roles, r.Role) {
		errs = append(errs, fmt.Errorf("rules[%d].role: %q is not one of %s", i, r.Role, strings.Join(Roles, ", ")))
	}
	if len(r.Principals)+len(r.UnixUsers)+len(r.UnixGroups) == 0 {
		errs = append(errs, fmt.Errorf("rules[%d]: names no principals, unix_users or unix_groups", i))
	}
	switch {
	case r.Role == RoleWriter && len(r.Owners) == 0:
		errs = append(errs, fmt.Errorf("rules[%d].owners: a writer needs the owners it may change (\"*\" for all)", i))
	case r.Role != RoleWriter && len(r.Owners) > 0:
		errs = append(errs, fmt.Errorf("rules[%d].owners: only a writer's rule limits owners (role %s)", i, r.Role))
	}
	for j, o := range r.Owners {
		if err := checkPattern(o, true); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field("owners", j), err))
		}
	}
	var tcp, unix []string
	for j, pr := range r.Principals {
		if err := checkPattern(pr, false); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field("principals", j), err))
		}
		tcp = append(tcp, pr)
	}
	for j, u := range r.UnixUsers {
		uid, err := lookupID(u, user.Lookup, func(u *user.User) string { return u.Uid })
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: user %w", field("unix_users", j), err))
		}
		unix = append(unix, "unix:uid:"+uid)
	}
	for j, g := range r.UnixGroups {
		gid, err := lookupID(g, user.LookupGroup, func(g *user.Group) string { return g.Gid })
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: group %w", field("unix_groups", j), err))
		}
		unix = append(unix, "unix:gid:"+gid)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var out []rule
	name := fmt.Sprintf("rules[%d]:%s", i, r.Role)
	if len(tcp) > 0 {
		out = append(out, rule{name: name, role: r.Role, transport: TransportTCP, principals: tcp, owners: r.Owners})
	}
	if len(unix) > 0 {
		out = append(out, rule{name: name, role: r.Role, transport: TransportUnix, principals: unix, owners: r.Owners})
	}
	return out, nil
}

// lookupID resolves a user or group name to its numeric ID; a number is taken as it is.
// Names are resolved when the policy is loaded: a user or group created later needs a
// reload.
func lookupID[T any](name string, lookup func(string) (T, error), id func(T) string) (string, error) {
	if name == "" {
		return "", errors.New("name is empty")
	}
	if _, err := strconv.ParseUint(name, 10, 32); err == nil {
		return name, nil
	}
	v, err := lookup(name)
	if err != nil {
		return "", fmt.Errorf("%q: %w", name, err)
	}
	return id(v), nil
}

// checkPattern accepts what gRPC's policy accepts: "*", "prefix*", "*suffix" or an
// exact name. Owners may be "" (services without an owner).
func checkPattern(p string, emptyOK bool) error {
	if p == "" && !emptyOK {
		return errors.New("is empty")
	}
	if p == "*" {
		return nil
	}
	inner := strings.TrimSuffix(strings.TrimPrefix(p, "*"), "*")
	if strings.HasPrefix(p, "*") && strings.HasSuffix(p, "*") {
		return fmt.Errorf("%q: a wildcard may stand at the start or the end, not both", p)
	}
	if strings.Contains(inner, "*") {
		return fmt.Errorf("%q: a wildcard may stand only at the start or the end", p)
	}
	return nil
}

// match reports whether a pattern matches a name, as gRPC's engine does ("*" matches
// any non-empty name).
func match(pattern, name string) bool {
	switch {
	case pattern == "*":
		return name != ""
	case strings.HasSuffix(pattern, "*"):
		return strings.HasPrefix(name, strings.TrimSuffix(pattern, "*"))
	case strings.HasPrefix(pattern, "*"):
		return strings.HasSuffix(name, strings.TrimPrefix(pattern, "*"))
	}
	return pattern == name
}

// matchOwner is match where "*" also matches the empty owner.
func matchOwner(pattern, owner string) bool {
	return pattern == "*" || match(pattern, owner)
}

// grpcPolicy is gRPC's authorization policy format (google.golang.org/grpc/authz).
type grpcPolicy struct {
	Name       string     `json:"name"`
	AllowRules []grpcRule `json:"allow_rules"`
}

type grpcRule struct {
	Name   string `json:"name"`
	Source struct {
		Principals []string `json:"principals"`
	} `json:"source"`
	Request struct {
		Paths []string `json:"paths"`
	} `json:"request"`
}

// engine builds gRPC's engine for the rules of one transport; nil when none has rules,
// which denies everything on it. Each transport has its own engine, so a certificate
// whose SAN reads "unix:uid:0" is matched against TCP rules only.
func engine(t Transport, rules []rule) (*authz.StaticInterceptor, error) {
	gp := grpcPolicy{Name: "lbd-" + string(t)}
	for _, r := range rules {
		if r.transport != t {
			continue
		}
		var gr grpcRule
		gr.Name = r.name
		gr.Source.Principals = r.principals
		gr.Request.Paths = roleMethods(r.role)
		gp.AllowRules = append(gp.AllowRules, gr)
	}
	if len(gp.AllowRules) == 0 {
		return nil, nil
	}
	js, err := json.Marshal(gp)
	if err != nil {
		return nil, fmt.Errorf("encode %s policy: %w", t, err)
	}
	e, err := authz.NewStatic(string(js))
	if err != nil {
		return nil, fmt.Errorf("compile %s policy: %w", t, err)
	}
	return e, nil
}

// grants returns the rules that match id.
func (p *Policy) grants(id Identity) []rule {
	var out []rule
	for _, r := range p.rules {
		if r.transport != id.Transport {
			continue
		}
		if slices.ContainsFunc(r.principals, func(pat string) bool {
			return slices.ContainsFunc(id.Names, func(n string) bool { return match(pat, n) })
		}) {
			out = append(out, r)
		}
	}
	return out
}

// RolesOf returns the roles id holds, sorted and without repeats.
func (p *Policy) RolesOf(id Identity) []string {
	var out []string
	for _, r := range p.grants(id) {
		if !slices.Contains(out, r.role) {
			out = append(out, r.role)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return slices.Index(Roles, a) - slices.Index(Roles, b) })
	return out
}
