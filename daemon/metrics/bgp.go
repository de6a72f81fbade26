package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/lbd-dev/lbd/daemon/advertise"
	"github.com/prometheus/client_golang/prometheus"
)

// BGPFunc reads the BGP speaker's sessions and routes.
type BGPFunc func(context.Context) (advertise.Metrics, error)

var (
	bgpRunning     = prometheus.NewDesc("lbd_bgp_speaker_running", "1 while the embedded BGP speaker runs.", nil, nil)
	bgpEstablished = prometheus.NewDesc("lbd_bgp_session_established", "1 if the BGP session with a peer is established.", []string{"peer", "peer_as", "state"}, nil)
	bgpPeerRoutes  = prometheus.NewDesc("lbd_bgp_peer_advertised_routes", "Prefixes advertised to a peer.", []string{"peer"}, nil)
	bgpRoutes      = prometheus.NewDesc("lbd_bgp_advertised_vips", "VIPs handed to the BGP speaker.", nil, nil)
	bgpAnnounced   = prometheus.NewDesc("lbd_bgp_announcements_total", "Route announcements sent since the speaker started.", nil, nil)
	bgpWithdrawn   = prometheus.NewDesc("lbd_bgp_withdrawals_total", "Route withdrawals sent since the speaker started.", nil, nil)
)

type bgpCollector struct{ read BGPFunc }

// AddBGP exports the BGP sessions and advertised routes at scrape time.
func (m *Metrics) AddBGP(read BGPFunc) { m.reg.MustRegister(&bgpCollector{read}) }

func (c *bgpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{bgpRunning, bgpEstablished, bgpPeerRoutes, bgpRoutes, bgpAnnounced, bgpWithdrawn} {
		ch <- d
	}
}

func (c *bgpCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := c.read(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(bgpRunning, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(bgpRunning, prometheus.GaugeValue, boolValue(m.Running))
	ch <- prometheus.MustNewConstMetric(bgpRoutes, prometheus.GaugeValue, float64(m.AdvertisedRoutes))
	ch <- prometheus.MustNewConstMetric(bgpAnnounced, prometheus.CounterValue, float64(m.Announcements))
	ch <- prometheus.MustNewConstMetric(bgpWithdrawn, prometheus.CounterValue, float64(m.Withdrawals))
	for _, p := range m.Peers {
		ch <- prometheus.MustNewConstMetric(bgpEstablished, prometheus.GaugeValue, boolValue(p.Established), p.Address, strconv.FormatUint(uint64(p.AS), 10), p.State)
		ch <- prometheus.MustNewConstMetric(bgpPeerRoutes, prometheus.GaugeValue, float64(p.AdvertisedRoutes), p.Address)
	}
}
