package connector

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gonixl/gonixl/connector/kvevents"
)

// Metrics counts what the roles do and times their handshakes, transfers and stagings. It is a
// prometheus.Collector: register it in the registry your server exposes (reg.MustRegister(m); serve the
// registry with promhttp.HandlerFor). One Metrics can be shared by several roles (register it once); the
// zero value is ready, NewMetrics adds constant labels. All methods are safe for concurrent use.
//
// The metric names follow Prometheus' conventions (base units in the name, _total on counters); where
// vLLM's NixlConnector exports the same figure, the name is vLLM's with gonixl_ for vllm:nixl_:
//
//	gonixl_xfer_time_seconds          histogram  vllm:nixl_xfer_time_seconds (decode: post to completion of the READ)
//	gonixl_kv_expired_reqs_total      counter    vllm:nixl_num_kv_expired_reqs_total (prefill)
//	gonixl_handshake_time_seconds     histogram  decode: side-channel handshake and metadata load (cache misses)
//	gonixl_stage_time_seconds         histogram  prefill: the fill function (staging the KV into the blocks)
//	gonixl_xfer_prepare_time_seconds  histogram  decode: a request's descriptor indices, notification and NIXL requests made
//	gonixl_xfer_post_time_seconds     histogram  decode: posting a request's READs
//	gonixl_xfer_wait_time_seconds     histogram  decode: last READ posted to the last one complete (progress, completion polls)
//	gonixl_notify_time_seconds        histogram  decode: notifications sent apart from the READs (host-buffered pipelines)
//	gonixl_held_time_seconds          histogram  prefill: a request published to its last notification (blocks freed)
//	gonixl_heartbeat_time_seconds     histogram  decode: one round of lease heartbeats to the prefill ranks read
//	gonixl_copy_time_seconds          histogram  decode: host → device copy (host-buffered caches)
//	gonixl_requests_total, gonixl_request_errors_total, gonixl_bytes_total, gonixl_blocks_held (gauge),
//	gonixl_blocks_freed_total, gonixl_blocks_expired_total, gonixl_heartbeats_total,
//	gonixl_notifications_total, gonixl_bad_messages_total, gonixl_rejected_notifications_total,
//	gonixl_handshakes_total, gonixl_remote_agent_conflicts_total, gonixl_forged_notifications_total,
//	gonixl_prefix_cache_queries_total, gonixl_prefix_cache_hits_total, gonixl_prefix_cache_misses_total
//	(tokens, as vLLM's vllm:prefix_cache_*), gonixl_prefix_cache_evictions_total, gonixl_prefix_cache_blocks
//	(gauge), gonixl_kv_events_published_total (batches), gonixl_kv_events_dropped_total,
//	gonixl_kv_events_subscribers (gauge): the counters.
//
// The phase histograms split a pull (decode) into its parts: prepare, post and wait add up to about
// gonixl_xfer_time_seconds plus the preparation before the first post; heartbeats run beside the wait.
//
// The roles alone count. A program reads a counter in Go through its method (Requests, Bytes,
// RequestsExpired, …; each one's doc names its series) and cannot change it.
type Metrics struct {
	requests              atomic.Int64
	requestErrors         atomic.Int64
	bytes                 atomic.Int64
	blocksHeld            atomic.Int64
	blocksFreed           atomic.Int64
	blocksExpired         atomic.Int64
	requestsExpired       atomic.Int64
	heartbeats            atomic.Int64
	notifications         atomic.Int64
	badMessages           atomic.Int64
	rejectedNotifications atomic.Int64
	handshakes            atomic.Int64
	agentConflicts        atomic.Int64
	forgedNotifications   atomic.Int64
	prefixQueries         atomic.Int64
	prefixHits            atomic.Int64
	prefixMisses          atomic.Int64
	prefixEvictions       atomic.Int64
	prefixBlocks          atomic.Int64
	kvEventsPublished     atomic.Int64
	kvEventsDropped       atomic.Int64

	labels prometheus.Labels
	once   sync.Once
	descs  []*prometheus.Desc // one per counter, in the order of counters()
	hists  [numTimings]prometheus.Histogram
	subs   *prometheus.Desc // gonixl_kv_events_subscribers

	pubMu sync.Mutex
	pubs  map[*kvevents.Publisher]bool // the KV-event publishers of the roles using m
}

// NewMetrics returns a Metrics whose series all carry labels (e.g. {"role": "prefill"}), so that several
// Metrics can be registered in one registry.
func NewMetrics(labels prometheus.Labels) *Metrics { return &Metrics{labels: labels} }

// Requests is the number of requests published (prefill) or pulled (decode): gonixl_requests_total.
func (m *Metrics) Requests() int64 { return m.requests.Load() }

// RequestErrors is the number of requests that failed: gonixl_request_errors_total.
func (m *Metrics) RequestErrors() int64 { return m.requestErrors.Load() }

// Bytes is the number of KV bytes read (decode) or published (prefill): gonixl_bytes_total.
func (m *Metrics) Bytes() int64 { return m.bytes.Load() }

// BlocksHeld is the number of blocks held for decode peers now (prefill): the gauge gonixl_blocks_held.
func (m *Metrics) BlocksHeld() int64 { return m.blocksHeld.Load() }

// BlocksFreed is the number of blocks freed after the decode peers' notifications (prefill):
// gonixl_blocks_freed_total.
func (m *Metrics) BlocksFreed() int64 { return m.blocksFreed.Load() }

// BlocksExpired is the number of blocks freed at lease expiry or abort timeout (prefill):
// gonixl_blocks_expired_total.
func (m *Metrics) BlocksExpired() int64 { return m.blocksExpired.Load() }

// RequestsExpired is the number of requests whose blocks expired unread (prefill):
// gonixl_kv_expired_reqs_total.
func (m *Metrics) RequestsExpired() int64 { return m.requestsExpired.Load() }

// Heartbeats is the number of lease heartbeats sent (decode) or received (prefill): gonixl_heartbeats_total.
func (m *Metrics) Heartbeats() int64 { return m.heartbeats.Load() }

// Notifications is the number of transfer notifications received (prefill): gonixl_notifications_total.
func (m *Metrics) Notifications() int64 { return m.notifications.Load() }

// BadMessages is the number of malformed notifications, or notifications for requests not held (prefill):
// gonixl_bad_messages_total.
func (m *Metrics) BadMessages() int64 { return m.badMessages.Load() }

// RejectedNotifications is the number of notifications from agents outside PrefillConfig.NotifyFrom
// (prefill): gonixl_rejected_notifications_total.
func (m *Metrics) RejectedNotifications() int64 { return m.rejectedNotifications.Load() }

// Handshakes is the number of side-channel handshakes done, cache misses (decode): gonixl_handshakes_total.
func (m *Metrics) Handshakes() int64 { return m.handshakes.Load() }

// AgentConflicts is the number of prefill handshakes refused because their NIXL metadata names an agent
// already loaded with other metadata, or regions that agent did not register (decode; ErrAgentConflict):
// gonixl_remote_agent_conflicts_total.
func (m *Metrics) AgentConflicts() int64 { return m.agentConflicts.Load() }

// ForgedNotifications is the number of notifications and heartbeat entries whose request id lacks the
// unguessable suffix the prefill worker handed out with the request (prefill): gonixl_forged_notifications_total.
func (m *Metrics) ForgedNotifications() int64 { return m.forgedNotifications.Load() }

// PrefixCacheQueries is the number of prompt tokens HoldTokens looked up in the prefix cache (prefill):
// gonixl_prefix_cache_queries_total.
func (m *Metrics) PrefixCacheQueries() int64 { return m.prefixQueries.Load() }

// PrefixCacheHits is the number of prompt tokens served from cached blocks (prefill):
// gonixl_prefix_cache_hits_total.
func (m *Metrics) PrefixCacheHits() int64 { return m.prefixHits.Load() }

// PrefixCacheMisses is the number of prompt tokens looked up and not found (prefill):
// gonixl_prefix_cache_misses_total.
func (m *Metrics) PrefixCacheMisses() int64 { return m.prefixMisses.Load() }

// PrefixCacheEvictions is the number of cached blocks evicted (prefill): gonixl_prefix_cache_evictions_total.
func (m *Metrics) PrefixCacheEvictions() int64 { return m.prefixEvictions.Load() }

// PrefixCacheBlocks is the number of blocks in the prefix cache now (prefill): the gauge
// gonixl_prefix_cache_blocks.
func (m *Metrics) PrefixCacheBlocks() int64 { return m.prefixBlocks.Load() }

// KVEventsPublished is the number of KV-event batches published (prefill): gonixl_kv_events_published_total.
func (m *Metrics) KVEventsPublished() int64 { return m.kvEventsPublished.Load() }

// KVEventsDropped is the number of KV-event messages subscribers missed because their queues were full
// (prefill): gonixl_kv_events_dropped_total.
func (m *Metrics) KVEventsDropped() int64 { return m.kvEventsDropped.Load() }

// KVEventsSubscribers is the number of subscribers connected to the KV-event sockets of the roles using m
// now (prefill): the gauge gonixl_kv_events_subscribers.
func (m *Metrics) KVEventsSubscribers() int {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	n := 0
	for p := range m.pubs {
		n += p.Stats().Subscribers
	}
	return n
}

// addPublisher counts p's subscribers in gonixl_kv_events_subscribers until removePublisher.
func (m *Metrics) addPublisher(p *kvevents.Publisher) {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	if m.pubs == nil {
		m.pubs = map[*kvevents.Publisher]bool{}
	}
	m.pubs[p] = true
}

func (m *Metrics) removePublisher(p *kvevents.Publisher) {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	delete(m.pubs, p)
}

// timing names what observe times.
type timing string

// The timings the roles record.
const (
	timingHandshake timing = "handshake" // decode: side-channel handshake and remote metadata load
	timingTransfer  timing = "transfer"  // decode: post to completion of a request's READs
	timingStage     timing = "stage"     // prefill: the fill function
	timingPrepare   timing = "prepare"   // decode: descriptor indices, notification, NIXL requests made
	timingPost      timing = "post"      // decode: the READs posted
	timingWait      timing = "wait"      // decode: last READ posted to the last one complete
	timingNotify    timing = "notify"    // decode: notifications sent apart from the READs
	timingHeld      timing = "held"      // prefill: published to the last notification
	timingHeartbeat timing = "heartbeat" // decode: one round of lease heartbeats
	timingCopy      timing = "copy"      // decode: host → device copy
)

const numTimings = 10

var timings = [numTimings]struct {
	t          timing
	name, help string
}{
	{timingHandshake, "gonixl_handshake_time_seconds", "Side-channel handshakes with a prefill peer, metadata load included (decode, cache misses only)."},
	{timingTransfer, "gonixl_xfer_time_seconds", "KV transfers, post to completion of a request's READs (decode; as vLLM's vllm:nixl_xfer_time_seconds)."},
	{timingStage, "gonixl_stage_time_seconds", "Staging a request's KV into its blocks: the fill function (prefill)."},
	{timingPrepare, "gonixl_xfer_prepare_time_seconds", "Preparing a request's READs: descriptor indices, notification, NIXL transfer requests made (decode)."},
	{timingPost, "gonixl_xfer_post_time_seconds", "Posting a request's READs (decode)."},
	{timingWait, "gonixl_xfer_wait_time_seconds", "Waiting for a request's READs: the last one posted to the last one complete (decode)."},
	{timingNotify, "gonixl_notify_time_seconds", "Sending a request's notifications apart from its READs (decode, host-buffered pipelines)."},
	{timingHeld, "gonixl_held_time_seconds", "A request's blocks held: published to the decode peers' last notification (prefill)."},
	{timingHeartbeat, "gonixl_heartbeat_time_seconds", "One round of lease heartbeats to the prefill ranks a request reads (decode)."},
	{timingCopy, "gonixl_copy_time_seconds", "Host to device copy of a request's blocks (decode, host-buffered caches)."},
}

// latencyBuckets holds every bucket of vLLM's NixlConnector latency histograms (1 ms to 5 s), so that
// dashboards compare like with like, plus finer ones below 1 ms for local and RDMA transfers and coarser
// ones for long stagings.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
	0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10, 30}

type counterInfo struct {
	name, help string
	gauge      bool
}

var counterInfos = []counterInfo{
	{"gonixl_requests_total", "Requests published (prefill) or pulled (decode).", false},
	{"gonixl_request_errors_total", "Requests that failed: the fill function (prefill); the handshake, READ or copy (decode).", false},
	{"gonixl_bytes_total", "KV bytes read (decode) or published (prefill).", false},
	{"gonixl_blocks_held", "KV blocks held for decode peers (prefill).", true},
	{"gonixl_blocks_freed_total", "KV blocks freed after the decode peers' notifications (prefill).", false},
	{"gonixl_blocks_expired_total", "KV blocks freed at lease expiry or abort timeout (prefill).", false},
	{"gonixl_kv_expired_reqs_total", "Requests whose KV blocks expired unread (prefill; as vLLM's vllm:nixl_num_kv_expired_reqs).", false},
	{"gonixl_heartbeats_total", "Lease heartbeats sent (decode) or received (prefill).", false},
	{"gonixl_notifications_total", "Transfer notifications received (prefill).", false},
	{"gonixl_bad_messages_total", "Malformed notifications, or notifications for requests not held (prefill).", false},
	{"gonixl_rejected_notifications_total", "Notifications from agents outside the prefill worker's allow-list.", false},
	{"gonixl_handshakes_total", "Side-channel handshakes done (decode).", false},
	{"gonixl_remote_agent_conflicts_total", "Prefill handshakes refused: their NIXL agent name is loaded with other metadata, or their regions are not that agent's (decode).", false},
	{"gonixl_forged_notifications_total", "Notifications or heartbeat ids without the request's unguessable suffix (prefill).", false},
	{"gonixl_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (prefill, HoldTokens; as vLLM's vllm:prefix_cache_queries).", false},
	{"gonixl_prefix_cache_hits_total", "Prompt tokens served from cached blocks (prefill; as vLLM's vllm:prefix_cache_hits).", false},
	{"gonixl_prefix_cache_misses_total", "Prompt tokens looked up and not cached (prefill).", false},
	{"gonixl_prefix_cache_evictions_total", "Cached blocks evicted (prefill; each is published as BlockRemoved).", false},
	{"gonixl_prefix_cache_blocks", "Blocks in the prefix cache, held or not (prefill).", true},
	{"gonixl_kv_events_published_total", "KV-event batches published (prefill; each holds the events of one change of the prefix cache).", false},
	{"gonixl_kv_events_dropped_total", "KV-event messages a slow subscriber missed (its queue was full; it can replay them).", false},
}

// counters returns the fields in the order of counterInfos.
func (m *Metrics) counters() []*atomic.Int64 {
	return []*atomic.Int64{&m.requests, &m.requestErrors, &m.bytes, &m.blocksHeld, &m.blocksFreed, &m.blocksExpired,
		&m.requestsExpired, &m.heartbeats, &m.notifications, &m.badMessages,
		&m.rejectedNotifications, &m.handshakes, &m.agentConflicts, &m.forgedNotifications,
		&m.prefixQueries, &m.prefixHits, &m.prefixMisses, &m.prefixEvictions, &m.prefixBlocks,
		&m.kvEventsPublished, &m.kvEventsDropped}
}

func (m *Metrics) init() {
	m.once.Do(func() {
		for _, c := range counterInfos {
			m.descs = append(m.descs, prometheus.NewDesc(c.name, c.help, nil, m.labels))
		}
		m.subs = prometheus.NewDesc("gonixl_kv_events_subscribers", "Subscribers connected to the KV-event sockets (prefill).", nil, m.labels)
		for i, t := range timings {
			m.hists[i] = prometheus.NewHistogram(prometheus.HistogramOpts{Name: t.name, Help: t.help,
				ConstLabels: m.labels, Buckets: latencyBuckets})
		}
	})
}

// observe records a duration of t. A nil Metrics, or a timing other than the constants, records nothing.
func (m *Metrics) observe(t timing, d time.Duration) {
	if m == nil {
		return
	}
	m.init()
	for i := range timings {
		if timings[i].t == t {
			m.hists[i].Observe(d.Seconds())
			return
		}
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.init()
	for _, d := range m.descs {
		ch <- d
	}
	ch <- m.subs
	for _, h := range m.hists {
		h.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.init()
	for i, v := range m.counters() {
		kind := prometheus.CounterValue
		if counterInfos[i].gauge {
			kind = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(m.descs[i], kind, float64(v.Load()))
	}
	ch <- prometheus.MustNewConstMetric(m.subs, prometheus.GaugeValue, float64(m.KVEventsSubscribers()))
	for _, h := range m.hists {
		h.Collect(ch)
	}
}

var _ prometheus.Collector = (*Metrics)(nil)
