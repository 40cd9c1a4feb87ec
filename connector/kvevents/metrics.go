package kvevents

import "github.com/prometheus/client_golang/prometheus"

// Metric names (Collector). The publisher's counters are read when Prometheus collects, so publishing costs
// nothing extra. A connector.Prefill's publisher is exported by the role's connector.Metrics (published,
// dropped and subscribers under the same names): register this Collector only for a Publisher of your own.
//
//	gonixl_kv_events_published_total        counter  batches published (Stats.Published)
//	gonixl_kv_events_dropped_total          counter  messages a slow subscriber missed (Stats.Dropped)
//	gonixl_kv_events_subscribers            gauge    subscribers connected
//	gonixl_kv_events_replay_requests_total  counter  replay requests answered
//	gonixl_kv_events_replayed_total         counter  batches resent through replay
//	gonixl_kv_events_bad_requests_total     counter  malformed replay requests (ignored)
//	gonixl_kv_events_refused_peers_total    counter  connections closed: handshake, limit or protocol error
var (
	descPublished = prometheus.NewDesc("gonixl_kv_events_published_total", "KV-event batches published.", nil, nil)
	descDropped   = prometheus.NewDesc("gonixl_kv_events_dropped_total", "KV-event messages a subscriber missed because its queue was full.", nil, nil)
	descSubs      = prometheus.NewDesc("gonixl_kv_events_subscribers", "KV-event subscribers connected.", nil, nil)
	descReplays   = prometheus.NewDesc("gonixl_kv_events_replay_requests_total", "KV-event replay requests answered.", nil, nil)
	descReplayed  = prometheus.NewDesc("gonixl_kv_events_replayed_total", "KV-event batches resent through replay.", nil, nil)
	descBad       = prometheus.NewDesc("gonixl_kv_events_bad_requests_total", "Malformed KV-event replay requests.", nil, nil)
	descRefused   = prometheus.NewDesc("gonixl_kv_events_refused_peers_total", "KV-event connections closed for a failed handshake, a limit or a protocol error.", nil, nil)
)

// Collector returns a prometheus.Collector of the publisher's Stats (register it once per publisher).
func (p *Publisher) Collector() prometheus.Collector { return collector{p} }

type collector struct{ p *Publisher }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPublished, descDropped, descSubs, descReplays, descReplayed, descBad, descRefused} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(s.Published))
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.Dropped))
	ch <- prometheus.MustNewConstMetric(descSubs, prometheus.GaugeValue, float64(s.Subscribers))
	ch <- prometheus.MustNewConstMetric(descReplays, prometheus.CounterValue, float64(s.ReplayRequests))
	ch <- prometheus.MustNewConstMetric(descReplayed, prometheus.CounterValue, float64(s.Replayed))
	ch <- prometheus.MustNewConstMetric(descBad, prometheus.CounterValue, float64(s.BadRequests))
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(s.RefusedPeers))
}
