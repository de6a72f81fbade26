package store

import (
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// TestPlanListsWhatApplyDoes: PlanServices changes nothing and lists exactly the changes
// that ApplyServices then makes and lists.
func TestPlanListsWhatApplyDoes(t *testing.T) {
	s := open(t, "")
	for _, svc := range []*lbdv1.Service{
		owned(testService("keep", "203.0.113.1", "198.18.1.1"), "ops"),
		owned(testService("grow", "203.0.113.2", "198.18.1.1"), "ops"),
		owned(testService("gone", "203.0.113.3", "198.18.1.1"), "ops"),
		owned(testService("other", "203.0.113.4", "198.18.1.1"), "k8s"),
	} {
		if _, err := s.CreateService(svc); err != nil {
			t.Fatal(err)
		}
	}
	before := s.ListServices("")
	want := []*lbdv1.Service{
		testService("keep", "203.0.113.1", "198.18.1.1"),
		testService("grow", "203.0.113.2", "198.18.1.1", "198.18.1.2"),
		testService("new", "203.0.113.5", "198.18.1.3"),
	}
	plan, err := s.PlanServices("ops", want)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	if after := s.ListServices(""); !equalServices(before, after) {
		t.Fatal("PlanServices changed the store")
	}
	got := map[string]lbdv1.ServiceChangeType{}
	for _, c := range plan.Changes {
		got[c.Name] = c.Type
	}
	wantTypes := map[string]lbdv1.ServiceChangeType{
		"gone": lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_DELETED,
		"grow": lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_UPDATED,
		"new":  lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_CREATED,
	}
	if len(got) != len(wantTypes) || len(plan.Changes) != len(wantTypes) {
		t.Fatalf("plan changes %v, want %v", got, wantTypes)
	}
	for n, typ := range wantTypes {
		if got[n] != typ {
			t.Errorf("plan: %s is %v, want %v", n, got[n], typ)
		}
	}
	if plan.Unchanged != 1 || plan.Created != 1 || plan.Updated != 1 || plan.Deleted != 1 {
		t.Errorf("plan counts %+v, want 1 of each", plan)
	}
	for _, c := range plan.Changes {
		if c.After.GetId() != 0 || c.Before.GetRevision() != 0 || c.Before.GetStatus() != nil {
			t.Errorf("change of %s carries IDs, revision or status: %v", c.Name, c)
		}
	}
	if g := plan.Changes[1]; len(g.Before.Backends) != 1 || len(g.After.Backends) != 2 {
		t.Errorf("grow: before %d backends, after %d; want 1 and 2", len(g.Before.Backends), len(g.After.Backends))
	}

	res, err := s.ApplyServices("ops", want)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if len(res.Changes) != len(plan.Changes) {
		t.Fatalf("apply made %d changes, plan listed %d", len(res.Changes), len(plan.Changes))
	}
	for i := range res.Changes {
		if !proto.Equal(res.Changes[i], plan.Changes[i]) {
			t.Errorf("change %d: apply %v, plan %v", i, res.Changes[i], plan.Changes[i])
		}
	}
	if _, err := s.GetService("gone"); Code(err).String() != "NotFound" {
		t.Errorf("gone after apply: %v", err)
	}
	if _, err := s.GetService("other"); err != nil {
		t.Errorf("another owner's service after apply: %v", err)
	}
	again, err := s.PlanServices("ops", want)
	if err != nil || len(again.Changes) != 0 || again.Unchanged != 3 {
		t.Errorf("plan after apply: %+v, %v; want no change", again, err)
	}
}

// TestApplyEmptyOwner: the empty owner is that of services created one by one; applying
// for it replaces those and leaves owned ones alone.
func TestApplyEmptyOwner(t *testing.T) {
	s := open(t, "")
	for _, svc := range []*lbdv1.Service{
		testService("by-hand", "203.0.113.1", "198.18.1.1"),
		owned(testService("k8s-svc", "203.0.113.2", "198.18.1.1"), "k8s"),
	} {
		if _, err := s.CreateService(svc); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.ApplyServices("", []*lbdv1.Service{testService("declared", "203.0.113.3", "198.18.1.1")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != 1 || res.Deleted != 1 {
		t.Errorf("result %+v, want 1 created and 1 deleted", res)
	}
	var names []string
	for _, svc := range s.ListServices("") {
		names = append(names, svc.Name)
	}
	if len(names) != 2 || names[0] != "declared" || names[1] != "k8s-svc" {
		t.Errorf("services %v, want [declared k8s-svc]", names)
	}
	if _, err := s.ApplyServices("", []*lbdv1.Service{owned(testService("x", "203.0.113.4"), "k8s")}); Code(err).String() != "InvalidArgument" {
		t.Errorf("a service of another owner in an apply for the empty owner: %v", err)
	}
}

// TestPlanRefusesWhatApplyRefuses: a plan over the memory budget fails as the apply would.
func TestPlanRefusesWhatApplyRefuses(t *testing.T) {
	perTable := func(m uint32) uint64 { return 8 * (2*uint64(m) + 1) }
	s, err := Open(Options{Limits: DefaultLimits(), Memory: func() MemoryBudget {
		return MemoryBudget{Tables: 2 * perTable(65537), Total: 1 << 30, Setting: "datapath.memory_budget",
			TableBytes: func(svc *lbdv1.Service) uint64 { return perTable(svc.MaglevTableSize) }}
	}})
	if err != nil {
		t.Fatal(err)
	}
	var three []*lbdv1.Service
	for i, vip := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"} {
		svc := testService(string(rune('a'+i)), vip, "198.18.1.1")
		svc.MaglevTableSize = 65537
		three = append(three, svc)
	}
	_, perr := s.PlanServices("o", three)
	_, aerr := s.ApplyServices("o", three)
	if perr == nil || aerr == nil || Code(perr) != Code(aerr) || perr.Error() != aerr.Error() {
		t.Errorf("plan: %v; apply: %v; want the same refusal", perr, aerr)
	}
}

func owned(svc *lbdv1.Service, owner string) *lbdv1.Service {
	svc.Owner = owner
	return svc
}

func equalServices(a, b []*lbdv1.Service) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, _ := protojson.Marshal(a[i])
		y, _ := protojson.Marshal(b[i])
		if string(x) != string(y) {
			return false
		}
	}
	return true
}
