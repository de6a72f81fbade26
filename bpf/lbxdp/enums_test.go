//go:build linux

package lbxdp

import (
	"testing"

	"github.com/lbd-dev/lbd/internal/enumcheck"
)

// The program's enums reach Go through bpf2go; the names of their values are Go's.
// A value the C side adds (or renumbers) without a Go name here fails; one it removes
// or renames breaks the build of the generated constants' users.
func TestEnumsNamed(t *testing.T) {
	spec, err := loadLbxdp()
	if err != nil {
		t.Fatal(err)
	}
	ctStates := make(map[uint64]string, len(ctStateNames))
	for s, n := range ctStateNames {
		ctStates[uint64(s)] = n
	}
	for _, c := range []struct {
		enum  string
		names map[uint64]string
		omit  []string
	}{
		{"lb_drop_reason", enumcheck.Table(dropNames[:]), []string{"LB_DROP_MAX", "LB_REASON_NONE"}},
		{"lb_quic_route", enumcheck.Table(quicRouteNames[:]), []string{"LB_QUIC_MAX"}},
		{"lb_ct_event", enumcheck.Table(ctEventNames[:ctKernelEvents]), []string{"LB_CT_EV_MAX"}},
		{"lb_ct_state", ctStates, nil},
		// Flags: the ones the package writes or reads, by their Go names.
		{"lb_ct_flag", map[uint64]string{uint64(ctTentative): "ctTentative"}, nil},
		{"lb_svc_flag", map[uint64]string{
			uint64(svcHashSrc): "svcHashSrc", uint64(svcDropNoBE): "svcDropNoBE", uint64(svcSrcRanges): "svcSrcRanges",
			uint64(svcAffinity): "svcAffinity", uint64(svcQUIC): "svcQUIC",
		}, nil},
		{"lbd_mon_flag", map[uint64]string{uint64(monReasons): "monReasons", uint64(monForwarded): "monForwarded"}, nil},
	} {
		if err := enumcheck.Names(spec.Types, c.enum, c.names, c.omit...); err != nil {
			t.Error(err)
		}
	}
}
