package translate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// Frontend identifies what lbd allows only one service to use: VIP, port and protocol.
type Frontend struct {
	VIP      netip.Addr
	Port     uint32
	Protocol lbdv1.Protocol
}

// FrontendOf returns an lbd service's frontend; ok is false if its VIP does not parse.
func FrontendOf(s *lbdv1.Service) (Frontend, bool) {
	a, err := netip.ParseAddr(s.Vip)
	if err != nil {
		return Frontend{}, false
	}
	return Frontend{VIP: a.Unmap(), Port: s.Port, Protocol: s.Protocol}, true
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s %s", netip.AddrPortFrom(f.VIP, uint16(f.Port)), strings.TrimPrefix(f.Protocol.String(), "PROTOCOL_"))
}

// Item is one Kubernetes Service's translation, with what orders claims on a frontend.
type Item struct {
	// Key is "<namespace>/<name>".
	Key     string
	Created time.Time
	Result  Result
}

// Taken is what lbd already holds for other owners: frontends and service names that the
// adapter's services must not use, or lbd would reject the whole apply.
type Taken struct {
	Frontends map[Frontend]string
	Names     map[string]bool
}

// Merge combines the translations into the set to apply. When two Services claim the same
// frontend, an ingress IP wins over an external IP (so spec.externalIPs cannot take an
// allocated VIP away), then the older Service keeps it (then the smaller key), as the
// first claimant would in a cluster; the other gets a problem. Frontends and names held by
// other owners are left out with a problem too. It returns the services sorted by name
// and the problems per key.
func Merge(items []Item, taken Taken) ([]*lbdv1.Service, map[string][]Problem) {
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b Item) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.Key, b.Key))
	})
	claimed := map[Frontend]string{}
	var out []*lbdv1.Service
	problems := map[string][]Problem{}
	for _, it := range sorted {
		if len(it.Result.Problems) > 0 {
			problems[it.Key] = append(problems[it.Key], it.Result.Problems...)
		}
	}
	for _, externals := range []bool{false, true} {
		for _, it := range sorted {
			for _, s := range it.Result.Services {
				fe, ok := FrontendOf(s)
				if !ok || slices.Contains(it.Result.ExternalVIPs, fe.VIP) != externals {
					continue
				}
				var msg string
				if other, used := taken.Frontends[fe]; used {
					msg = fmt.Sprintf("frontend %s is used by lbd service %q of another owner", fe, other)
				} else if taken.Names[s.Name] {
					msg = fmt.Sprintf("lbd service name %q is used by another owner", s.Name)
				} else if winner, used := claimed[fe]; used {
					msg = fmt.Sprintf("frontend %s is already used by Service %s", fe, winner)
				}
				if msg != "" {
					problems[it.Key] = append(problems[it.Key], Problem{Reason: "FrontendConflict", Message: msg})
					continue
				}
				claimed[fe] = it.Key
				out = append(out, s)
			}
		}
	}
	slices.SortFunc(out, func(a, b *lbdv1.Service) int { return strings.Compare(a.Name, b.Name) })
	return out, problems
}
