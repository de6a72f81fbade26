package advertise

import (
	"context"
	"time"

	"github.com/lbd-dev/lbd/daemon/bgp"
)

// speakerCheck is how often WatchPeers looks whether the speaker it follows is still
// the controller's (none at first, until Run starts it).
const speakerCheck = time.Second

// WatchPeers calls changed whenever a BGP session changes state, until ctx ends:
// changed must not block (it pokes whoever then lists the peers). Peers added or
// removed through the API show up this way too, as their sessions start and stop.
func (c *Controller) WatchPeers(ctx context.Context, changed func()) {
	go func() {
		var watched *bgp.Speaker
		t := time.NewTicker(speakerCheck)
		defer t.Stop()
		for {
			if sp := c.currentSpeaker(); sp != nil && sp != watched {
				if err := sp.WatchPeers(ctx, func(bgp.PeerEvent) { changed() }); err == nil {
					watched = sp
					// What changed before the watch began.
					changed()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}
