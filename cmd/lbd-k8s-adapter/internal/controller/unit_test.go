package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRejected(t *testing.T) {
	svcs := []*lbdv1.Service{{Name: "a"}, {Name: "b", Backends: []*lbdv1.Backend{{}, {}}}}
	wrap := func(c codes.Code, msg string) error {
		return fmt.Errorf("apply 2 services to lbd: %w", status.Error(c, msg))
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{wrap(codes.InvalidArgument, "services[1].backends[1].address: \"224.0.0.1\" is a multicast address"), "1/1 backends[1].address: \"224.0.0.1\" is a multicast address"},
		{wrap(codes.InvalidArgument, "services[0].backends: 3 backends exceed the limit of 2 per service"), "0/-1 backends: 3 backends exceed the limit of 2 per service"},
		{wrap(codes.AlreadyExists, "services[1].vip: frontend 203.0.113.1:80/tcp is already used"), "1/-1 vip: frontend 203.0.113.1:80/tcp is already used"},
		{wrap(codes.InvalidArgument, "services[1]: something"), "1/-1 : something"},
		{wrap(codes.FailedPrecondition, "services: 20000 services would exceed the limit"), "not one service"},
		{wrap(codes.InvalidArgument, "services[7].name: out of range"), "not one service"},
		{wrap(codes.InvalidArgument, "services[1].backends[5].port: out of range"), "not one service"},
		{wrap(codes.Unavailable, "services[0].vip: connection refused"), "not one service"},
		{errors.New("services[0].vip: not from lbd"), "not one service"},
	} {
		r, ok := rejected(tc.err, svcs)
		got := "not one service"
		if ok {
			got = fmt.Sprintf("%d/%d %s: %s", r.service, r.backend, r.field, r.msg)
		}
		if got != tc.want {
			t.Errorf("rejected(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestHealth(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := NewHealth()
	h.now = func() time.Time { return now }
	check := func(step string, ready, live string) {
		t.Helper()
		errText := func(err error) string {
			if err == nil {
				return "ok"
			}
			return err.Error()
		}
		if got := errText(h.Ready()); !strings.Contains(got, ready) {
			t.Errorf("%s: Ready = %q, want %q", step, got, ready)
		}
		if got := errText(h.Live()); !strings.Contains(got, live) {
			t.Errorf("%s: Live = %q, want %q", step, got, live)
		}
	}
	check("start", "informer caches not synced", "ok")
	h.setInformersSynced()
	check("informers synced", "lbd not programmed yet", "ok")
	h.syncStarted()
	h.syncEnded(errors.New("lbd down"))
	check("failed sync", "last sync failed: lbd down", "ok")
	h.syncStarted()
	now = now.Add(time.Minute)
	check("slow sync", "last sync failed", "ok")
	now = now.Add(2 * time.Minute)
	check("stuck sync", "last sync failed", "a sync has been running since")
	h.syncEnded(nil)
	check("synced", "ok", "ok")
}

func TestWanted(t *testing.T) {
	for _, tc := range []struct {
		annotation *string
		specIP     string
		want       string
	}{
		{specIP: "203.0.113.1", want: "[203.0.113.1] "},
		{annotation: new("203.0.113.2, 2001:db8:ff::2"), specIP: "203.0.113.1", want: "[203.0.113.2 2001:db8:ff::2] "},
		{annotation: new(""), specIP: "203.0.113.1", want: "[] "},
		{annotation: new("203.0.113.2,203.0.113.3"), want: "[] annotation lbd-dev.github.io/load-balancer-ips: \"203.0.113.2,203.0.113.3\" asks for two addresses of one family"},
		{specIP: "nonsense", want: "[] spec.loadBalancerIP: \"nonsense\" is not an IP address"},
	} {
		s := &corev1.Service{Spec: corev1.ServiceSpec{LoadBalancerIP: tc.specIP}}
		if tc.annotation != nil {
			s.Annotations = map[string]string{AnnotationIPs: *tc.annotation}
		}
		ips, why := wanted(s)
		if got := fmt.Sprintf("%v %s", ips, why); got != tc.want {
			t.Errorf("wanted(%v, %q) = %q, want %q", tc.annotation, tc.specIP, got, tc.want)
		}
	}
}

// TestProgrammedCondition covers what the condition says in each state of a Service's
// lbd services.
func TestProgrammedCondition(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	withIngress := svc.DeepCopy()
	withIngress.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.1"}}
	vip := []netip.Addr{netip.MustParseAddr("203.0.113.1")}
	changed := withIngress.DeepCopy()
	changed.Spec.Ports[0].Port = 81
	name := "ns/web/http/tcp/203.0.113.1"
	stateOf := func(st lbdv1.ServiceState, applied ...string) *state {
		s := newState()
		s.translated["ns/web"] = withIngress
		s.applied["ns/web"] = applied
		s.lbd[name] = &lbdv1.ServiceStatus{State: st, Reason: "map full"}
		return s
	}
	for _, tc := range []struct {
		svc     *corev1.Service
		ingress []netip.Addr
		st      *state
		want    string
	}{
		{svc, nil, newState(), "False NoIngressIP"},
		{withIngress, vip, newState(), "False Pending: the adapter has not yet applied"},
		{changed, vip, stateOf(lbdv1.ServiceState_SERVICE_STATE_READY, name), "False Pending: the adapter has not yet applied"},
		{withIngress, vip, stateOf(lbdv1.ServiceState_SERVICE_STATE_READY), "False NotServed"},
		{withIngress, vip, stateOf(lbdv1.ServiceState_SERVICE_STATE_PENDING, name), "False Pending: lbd on n1 has programmed 0 of 1"},
		{withIngress, vip, stateOf(lbdv1.ServiceState_SERVICE_STATE_ERROR, name), "False ProgrammingFailed: lbd on n1 failed to program ns/web/http/tcp/203.0.113.1: map full"},
		{withIngress, vip, stateOf(lbdv1.ServiceState_SERVICE_STATE_NO_BACKENDS, name), "True NoUsableBackends"},
		{withIngress, vip, stateOf(lbdv1.ServiceState_SERVICE_STATE_READY, name), "True Programmed: lbd on n1 has programmed 1 VIP × port: http/tcp/203.0.113.1"},
	} {
		c := programmedCondition(tc.svc, tc.ingress, tc.st.snapshot("ns/web"), "n1")
		if got := fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message); !strings.HasPrefix(got, tc.want) {
			t.Errorf("condition = %q, want %q...", got, tc.want)
		}
	}
}
