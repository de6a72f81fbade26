//go:build linux

package datapath

import (
	"github.com/lbd-dev/lbd/bpf/backendtc"
	"github.com/lbd-dev/lbd/bpf/lbxdp"
	"github.com/lbd-dev/lbd/bpf/socklb"
)

// Defaults of the sizes lbd's configuration gives the datapath (daemon/config): the
// programs' own, compiled into them and generated for Go from their headers, so that
// a node configured with nothing gets the maps the programs are built with. The
// ID-indexed maps are sized from the store's limits instead (Config.MaxServices).
const (
	DefaultConntrackSize      = lbxdp.DefaultConntrackSize
	DefaultConntrackGuardRate = lbxdp.DefaultGuardRate
	DefaultNATSize            = backendtc.DefaultNATMaxEntries
	DefaultSocketTranslations = socklb.DefaultRevNATSize
)
