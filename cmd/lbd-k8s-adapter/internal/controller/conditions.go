package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/lbd-dev/lbd/cmd/lbd-k8s-adapter/internal/ipam"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The conditions the adapter keeps on its LoadBalancer Services (`kubectl get svc -o
// yaml`; `kubectl describe svc` shows the Events).
const (
	// ConditionIPAllocated: the Service has an address of every family from the pools
	// (only with pools configured).
	ConditionIPAllocated = "lbd-dev.github.io/IPAllocated"
	// ConditionAccepted: every port, VIP and endpoint of the Service is served as asked;
	// False names what was left out and why.
	ConditionAccepted = "lbd-dev.github.io/Accepted"
	// ConditionProgrammed: lbd (on the node of the replica writing status) has programmed
	// every VIP × port of the Service.
	ConditionProgrammed = "lbd-dev.github.io/Programmed"
)

// maxConditionMessage is the API's limit on a condition's message.
const maxConditionMessage = 32768

// setCondition sets one condition in st; its transition time changes only with its
// status (apimachinery's rule).
func setCondition(st *corev1.ServiceStatus, svc *corev1.Service, c metav1.Condition) {
	c.ObservedGeneration = svc.Generation
	if len(c.Message) > maxConditionMessage {
		c.Message = c.Message[:maxConditionMessage-3] + "..."
	}
	apimeta.SetStatusCondition(&st.Conditions, c)
}

func condition(typ string, ok bool, reason, message string) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message}
}

func allocatedCondition(d ipam.Decision) metav1.Condition {
	return condition(ConditionIPAllocated, d.Allocated, d.Reason, d.Message)
}

func acceptedCondition(snap snapshot) metav1.Condition {
	if len(snap.problems) == 0 {
		return condition(ConditionAccepted, true, "Accepted", "every port, VIP and endpoint is served as asked")
	}
	msgs := make([]string, len(snap.problems))
	for i, p := range snap.problems {
		msgs[i] = p.Reason + ": " + p.Message
	}
	return condition(ConditionAccepted, false, snap.problems[0].Reason, strings.Join(msgs, "; "))
}

// programmedCondition says whether lbd has programmed what the Service (with the ingress
// IPs about to be written) asks for.
func programmedCondition(svc *corev1.Service, ingress []netip.Addr, snap snapshot, node string) metav1.Condition {
	cond := func(ok bool, reason, format string, args ...any) metav1.Condition {
		return condition(ConditionProgrammed, ok, reason, fmt.Sprintf(format, args...))
	}
	t := snap.translated
	// Our own status writes change the object but not what lbd is given: compare what the
	// translation reads (the spec and the ingress IPs).
	if t == nil || !equality.Semantic.DeepEqual(t.Spec, svc.Spec) || !slices.Equal(ingressIPs(t), ingress) {
		if len(ingress) == 0 && len(svc.Spec.ExternalIPs) == 0 {
			return cond(false, "NoIngressIP", "no ingress IP to serve yet")
		}
		return cond(false, "Pending", "the adapter has not yet applied the current Service to lbd")
	}
	p := snap.progress
	switch {
	case p.total == 0 && len(ingress) == 0:
		return cond(false, "NoIngressIP", "no ingress IP to serve yet")
	case p.total == 0:
		return cond(false, "NotServed", "no VIP × port of this Service is served: see condition %s", ConditionAccepted)
	case len(p.errors) > 0:
		return cond(false, "ProgrammingFailed", "lbd on %s failed to program %s", node, strings.Join(p.errors, "; "))
	case !p.complete():
		return cond(false, "Pending", "lbd on %s has programmed %d of %d VIP × port", node, p.programmed, p.total)
	case p.noBackends > 0:
		return cond(true, "NoUsableBackends", "lbd on %s has programmed %d VIP × port; %d have no usable backend and refuse new connections", node, p.total, p.noBackends)
	}
	return cond(true, "Programmed", "lbd on %s has programmed %d VIP × port: %s", node, p.total, named(p.done))
}
