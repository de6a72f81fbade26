package lbd

import (
	"github.com/lbd-dev/lbd/daemon/api"
	"github.com/lbd-dev/lbd/daemon/datapath"
)

// tablesOf is the datapath whose tables the fleet RPCs digest: a node's that programs
// services (LB role, socket-level load balancing), nil on others.
func tablesOf(dp *openingDatapath, dcfg datapath.Config) api.Tables {
	if !(dcfg.LB || dcfg.SocketLB) {
		return nil
	}
	return dp
}

// TableDigests implements api.Tables.
func (d *openingDatapath) TableDigests() (map[string]string, error) {
	m, err := d.manager()
	if err != nil {
		return nil, err
	}
	return m.TableDigests()
}
