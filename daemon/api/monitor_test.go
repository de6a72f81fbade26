package api

import (
	"strings"
	"testing"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMonitorFilter: a filter naming an unknown reason, an empty service or drops of
// forwarded packets is INVALID_ARGUMENT naming the field; "forwarded" as a reason asks
// for forwarded packets.
func TestMonitorFilter(t *testing.T) {
	reasons := []string{"malformed", "no_service"}
	for _, c := range []struct {
		req   *lbdv1.MonitorDatapathRequest
		field string
	}{
		{&lbdv1.MonitorDatapathRequest{Reasons: []string{"malformed", "malformd"}}, "reasons[1]"},
		{&lbdv1.MonitorDatapathRequest{Services: []string{"web", ""}}, "services[1]"},
		{&lbdv1.MonitorDatapathRequest{DropsOnly: true, Forwarded: true}, "drops_only"},
		{&lbdv1.MonitorDatapathRequest{DropsOnly: true, Reasons: []string{"forwarded"}}, "drops_only"},
	} {
		_, err := monitorFilter(c.req, reasons)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), c.field) {
			t.Errorf("%v: %v, want INVALID_ARGUMENT about %s", c.req, err, c.field)
		}
	}
	f, err := monitorFilter(&lbdv1.MonitorDatapathRequest{Reasons: []string{"no_service", "forwarded"}, Services: []string{"web*"}}, reasons)
	if err != nil || !f.Forwarded || !f.Services.Match("web-1") || f.Services.Match("dns") {
		t.Errorf("a valid filter: %+v, %v", f, err)
	}
}
