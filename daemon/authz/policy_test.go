package authz

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

func load(t *testing.T, policy string) (*Policy, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(path, 0)
}

// TestBadPolicies: each mistake is refused with the field it is in.
func TestBadPolicies(t *testing.T) {
	for _, tc := range []struct{ policy, want string }{
		{"rules:\n  - role: root\n    principals: [a]\n", `rules[0].role: "root" is not one of reader, operator, writer, admin`},
		{"rules:\n  - role: reader\n", "rules[0]: names no principals"},
		{"rules:\n  - role: writer\n    principals: [a]\n", "rules[0].owners: a writer needs the owners"},
		{"rules:\n  - role: reader\n    principals: [a]\n    owners: [x]\n", "rules[0].owners: only a writer's rule"},
		{"rules:\n  - role: reader\n    principals: [a]\n  - role: reader\n    principals: [\"a*b\"]\n", "rules[1].principals[0]: \"a*b\""},
		{"rules:\n  - role: reader\n    principals: [\"*a*\"]\n", "rules[0].principals[0]"},
		{"rules:\n  - role: reader\n    unix_groups: [no-such-group-lbd]\n", "rules[0].unix_groups[0]: group \"no-such-group-lbd\""},
		{"rules:\n  - role: reader\n    unix_users: [no-such-user-lbd]\n", "rules[0].unix_users[0]: user \"no-such-user-lbd\""},
		{"rules:\n  - role: reader\n    principal: [a]\n", "unknown field"},
	} {
		_, err := load(t, tc.policy)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("policy %q: %v, want an error containing %q", tc.policy, err, tc.want)
		}
	}
}

// TestMatchLikeGRPC: the owner check's matcher reads patterns as gRPC's engine does.
func TestMatchLikeGRPC(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"*", "x", true}, {"*", "", false}, {"k8s/*", "k8s/a", true}, {"k8s/*", "k8s", false},
		{"*.example", "a.example", true}, {"a", "a", true}, {"a", "ab", false},
	} {
		if got := match(tc.pattern, tc.name); got != tc.want {
			t.Errorf("match(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
	if !matchOwner("*", "") {
		t.Error(`owner pattern "*" does not match services without an owner`)
	}
}

// TestEveryWriteHasAnOwner: the owner check knows the request of every Write method.
func TestEveryWriteHasAnOwner(t *testing.T) {
	for m, a := range methods {
		if a != Write {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(m, "/"), "/")
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(parts[0]))
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(parts[1]))
		mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if _, err := touched(mt.New().Interface(), func(string) (string, bool) { return "", false }); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	_, err := touched(&lbdv1.GetNodeRequest{}, nil)
	if err == nil {
		t.Errorf("touched(GetNodeRequest) = %v, want an error", err)
	}
}
