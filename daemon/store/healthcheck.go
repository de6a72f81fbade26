package store

import (
	"net/url"
	"strings"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// normalizeHealthCheck validates a service's health check and fills its defaults.
func normalizeHealthCheck(s *lbdv1.Service) *Error {
	hc := s.HealthCheck
	if hc == nil {
		return nil
	}
	switch hc.Type {
	case lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_UNSPECIFIED:
		return invalid("service.health_check.type", "is required (NONE, TCP, HTTP or HTTPS)")
	case lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_NONE:
		s.HealthCheck = nil
		return nil
	case lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP, lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP, lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTPS:
	default:
		return invalid("service.health_check.type", "unknown type %d", hc.Type)
	}
	if err := validPort("service.health_check.port", hc.Port); err != nil {
		return err
	}
	if s.Port == 0 && hc.Port == 0 {
		return invalid("service.health_check.port", "is required for a service on all ports")
	}
	if s.Protocol == lbdv1.Protocol_PROTOCOL_SCTP && hc.Port == 0 {
		return invalid("service.health_check.port", "is required for an SCTP service: probes are TCP or HTTP(S), "+
			"so name the port where the backends answer them")
	}
	http := hc.Type != lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP
	if !http {
		switch {
		case hc.Path != "":
			return invalid("service.health_check.path", "only HTTP and HTTPS checks have a path")
		case hc.Host != "":
			return invalid("service.health_check.host", "only HTTP and HTTPS checks have a host")
		case hc.ExpectedStatusMin != 0 || hc.ExpectedStatusMax != 0:
			return invalid("service.health_check.expected_status_min", "only HTTP and HTTPS checks have a status range")
		}
	}
	if hc.InsecureSkipVerify && hc.Type != lbdv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTPS {
		return invalid("service.health_check.insecure_skip_verify", "only HTTPS checks verify certificates")
	}
	if http {
		if hc.Path == "" {
			hc.Path = "/"
		}
		if u, err := url.ParseRequestURI(hc.Path); err != nil || hc.Path[0] != '/' || len(hc.Path) > 1024 || u.Host != "" ||
			strings.ContainsFunc(hc.Path, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return invalid("service.health_check.path", "%q must be a URL path starting with /, without spaces, at most 1024 characters", hc.Path)
		}
		if strings.ContainsFunc(hc.Host, func(r rune) bool { return r <= ' ' || r == '/' || r == 0x7f }) || len(hc.Host) > 255 {
			return invalid("service.health_check.host", "%q must be a host name or host:port", hc.Host)
		}
		if hc.ExpectedStatusMin == 0 && hc.ExpectedStatusMax == 0 {
			hc.ExpectedStatusMin, hc.ExpectedStatusMax = defaultStatusMin, defaultStatusMax
		}
		if hc.ExpectedStatusMin < 100 || hc.ExpectedStatusMax > 599 || hc.ExpectedStatusMin > hc.ExpectedStatusMax {
			return invalid("service.health_check.expected_status_min", "range %d-%d must lie within 100-599 with min ≤ max", hc.ExpectedStatusMin, hc.ExpectedStatusMax)
		}
	}
	interval, err := durationOr("service.health_check.interval", hc.Interval, defaultHCInterval)
	if err != nil {
		return err
	}
	timeout, err := durationOr("service.health_check.timeout", hc.Timeout, defaultHCTimeout)
	if err != nil {
		return err
	}
	if interval < minHCInterval || interval > maxHCInterval {
		return invalid("service.health_check.interval", "%v must be from %v to %v", interval, minHCInterval, maxHCInterval)
	}
	if hc.Timeout == nil && timeout >= interval {
		timeout = interval / 2
	}
	if timeout <= 0 || timeout >= interval {
		return invalid("service.health_check.timeout", "%v must be positive and below the interval %v", timeout, interval)
	}
	hc.Interval, hc.Timeout = durationpb.New(interval), durationpb.New(timeout)
	if hc.Rise == 0 {
		hc.Rise = defaultHCRise
	}
	if hc.Fall == 0 {
		hc.Fall = defaultHCFall
	}
	if hc.Rise > maxRiseFall {
		return invalid("service.health_check.rise", "%d exceeds %d", hc.Rise, maxRiseFall)
	}
	if hc.Fall > maxRiseFall {
		return invalid("service.health_check.fall", "%d exceeds %d", hc.Fall, maxRiseFall)
	}
	return nil
}

func durationOr(field string, d *durationpb.Duration, def time.Duration) (time.Duration, *Error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid(field, "%v", err)
	}
	return d.AsDuration(), nil
}
