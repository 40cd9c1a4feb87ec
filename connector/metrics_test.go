package connector

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// gather collects c through a pedantic registry (which checks Describe against Collect) and returns each
// counter's and gauge's value by name, and each histogram's count and sum as name_count and name_sum.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	fams, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range fams {
		require.Len(t, f.GetMetric(), 1, f.GetName())
		m := f.GetMetric()[0]
		switch {
		case m.Counter != nil:
			out[f.GetName()] = m.GetCounter().GetValue()
		case m.Gauge != nil:
			out[f.GetName()] = m.GetGauge().GetValue()
		case m.Histogram != nil:
			out[f.GetName()+"_count"] = float64(m.GetHistogram().GetSampleCount())
			out[f.GetName()+"_sum"] = m.GetHistogram().GetSampleSum()
		default:
			t.Fatalf("unexpected metric type of %s", f.GetName())
		}
	}
	return out
}

func TestMetricsCollector(t *testing.T) {
	var m Metrics // the zero value is ready
	s := gather(t, &m)
	assert.Len(t, s, len(counterInfos)+1+2*numTimings, "every counter, gauge and histogram is exported, also before any traffic")
	assert.Zero(t, s["gonixl_kv_events_subscribers"])
	assert.Zero(t, s["gonixl_requests_total"])

	m.requests.Add(3)
	m.bytes.Add(1 << 20)
	m.blocksHeld.Add(5)
	m.blocksHeld.Add(-2)
	m.blocksExpired.Add(4)
	m.requestsExpired.Add(1)
	m.handshakes.Add(1)
	m.observe(timingTransfer, 2*time.Millisecond)
	m.observe("transfer", 4*time.Millisecond)
	m.observe(timingHandshake, 30*time.Millisecond)
	m.observe("no such timing", time.Second) // recorded nowhere
	var nilM *Metrics
	nilM.observe(timingStage, time.Second) // a nil Metrics ignores observations

	require.NoError(t, testutil.CollectAndCompare(&m, strings.NewReader(`
# HELP gonixl_requests_total Requests published (prefill) or pulled (decode).
# TYPE gonixl_requests_total counter
gonixl_requests_total 3
# HELP gonixl_bytes_total KV bytes read (decode) or published (prefill).
# TYPE gonixl_bytes_total counter
gonixl_bytes_total 1.048576e+06
# HELP gonixl_blocks_held KV blocks held for decode peers (prefill).
# TYPE gonixl_blocks_held gauge
gonixl_blocks_held 3
# HELP gonixl_kv_expired_reqs_total Requests whose KV blocks expired unread (prefill; as vLLM's vllm:nixl_num_kv_expired_reqs).
# TYPE gonixl_kv_expired_reqs_total counter
gonixl_kv_expired_reqs_total 1
# HELP gonixl_handshake_time_seconds Side-channel handshakes with a prefill peer, metadata load included (decode, cache misses only).
# TYPE gonixl_handshake_time_seconds histogram
gonixl_handshake_time_seconds_bucket{le="0.0001"} 0
gonixl_handshake_time_seconds_bucket{le="0.00025"} 0
gonixl_handshake_time_seconds_bucket{le="0.0005"} 0
gonixl_handshake_time_seconds_bucket{le="0.001"} 0
gonixl_handshake_time_seconds_bucket{le="0.0025"} 0
gonixl_handshake_time_seconds_bucket{le="0.005"} 0
gonixl_handshake_time_seconds_bucket{le="0.01"} 0
gonixl_handshake_time_seconds_bucket{le="0.025"} 0
gonixl_handshake_time_seconds_bucket{le="0.05"} 1
gonixl_handshake_time_seconds_bucket{le="0.075"} 1
gonixl_handshake_time_seconds_bucket{le="0.1"} 1
gonixl_handshake_time_seconds_bucket{le="0.2"} 1
gonixl_handshake_time_seconds_bucket{le="0.3"} 1
gonixl_handshake_time_seconds_bucket{le="0.5"} 1
gonixl_handshake_time_seconds_bucket{le="0.75"} 1
gonixl_handshake_time_seconds_bucket{le="1"} 1
gonixl_handshake_time_seconds_bucket{le="2.5"} 1
gonixl_handshake_time_seconds_bucket{le="5"} 1
gonixl_handshake_time_seconds_bucket{le="10"} 1
gonixl_handshake_time_seconds_bucket{le="30"} 1
gonixl_handshake_time_seconds_bucket{le="+Inf"} 1
gonixl_handshake_time_seconds_sum 0.03
gonixl_handshake_time_seconds_count 1
`), "gonixl_requests_total", "gonixl_bytes_total", "gonixl_blocks_held", "gonixl_kv_expired_reqs_total",
		"gonixl_handshake_time_seconds"))

	s = gather(t, &m)
	assert.EqualValues(t, 4, s["gonixl_blocks_expired_total"])
	assert.EqualValues(t, 1, s["gonixl_handshakes_total"])
	assert.EqualValues(t, 2, s["gonixl_xfer_time_seconds_count"])
	assert.InDelta(t, 0.006, s["gonixl_xfer_time_seconds_sum"], 1e-12)
	assert.Zero(t, s["gonixl_stage_time_seconds_count"])
}

// The names and help texts pass Prometheus' own linter.
func TestMetricsLint(t *testing.T) {
	m := NewMetrics(prometheus.Labels{"role": "prefill"})
	m.observe(timingStage, time.Millisecond)
	problems, err := testutil.CollectAndLint(m)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// Two roles' Metrics in one registry, told apart by their labels, served by promhttp as a server would.
func TestMetricsRegistry(t *testing.T) {
	pre, dec := NewMetrics(prometheus.Labels{"role": "prefill"}), NewMetrics(prometheus.Labels{"role": "decode"})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(pre))
	require.NoError(t, reg.Register(dec))
	require.Error(t, reg.Register(NewMetrics(prometheus.Labels{"role": "decode"})), "the same series twice")
	pre.requests.Add(2)
	dec.requests.Add(1)
	dec.observe(timingTransfer, time.Millisecond)

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Contains(t, string(body), `gonixl_requests_total{role="prefill"} 2`)
	assert.Contains(t, string(body), `gonixl_requests_total{role="decode"} 1`)
	assert.Contains(t, string(body), `gonixl_xfer_time_seconds_count{role="decode"} 1`)
}

// The roles' metrics after real traffic.
func TestMetricsAfterTraffic(t *testing.T) {
	p, _ := protocol.ProfileByName("0.16")
	pr := newPair(t, p, pairOpts{})
	ctx := testenv.Context(t, 10*time.Second)
	kv, err := pr.pre.Hold(ctx, "m1", 2*tinyBlock, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 2, gather(t, pr.preM)["gonixl_blocks_held"])
	_, err = pr.dec.Pull(ctx, "m1", kv, []int{1, 2})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
	ps, ds := gather(t, pr.preM), gather(t, pr.decM)
	assert.EqualValues(t, 0, ps["gonixl_blocks_held"])
	assert.EqualValues(t, 2, ps["gonixl_blocks_freed_total"])
	assert.EqualValues(t, 1, ps["gonixl_notifications_total"])
	assert.EqualValues(t, 1, ps["gonixl_stage_time_seconds_count"])
	assert.EqualValues(t, 1, ds["gonixl_requests_total"])
	assert.EqualValues(t, 1, ds["gonixl_handshakes_total"])
	assert.EqualValues(t, 1, ds["gonixl_handshake_time_seconds_count"])
	assert.EqualValues(t, 1, ds["gonixl_xfer_time_seconds_count"])
	for _, phase := range []string{"gonixl_xfer_prepare_time_seconds", "gonixl_xfer_post_time_seconds", "gonixl_xfer_wait_time_seconds"} {
		assert.EqualValues(t, 1, ds[phase+"_count"], phase)
		assert.Positive(t, ds[phase+"_sum"], phase)
	}
	assert.LessOrEqual(t, ds["gonixl_xfer_post_time_seconds_sum"]+ds["gonixl_xfer_wait_time_seconds_sum"], ds["gonixl_xfer_time_seconds_sum"],
		"post and wait are parts of the transfer")
	assert.Zero(t, ds["gonixl_copy_time_seconds_count"], "a DRAM cache copies nothing")
	assert.EqualValues(t, 1, ps["gonixl_held_time_seconds_count"])
	assert.GreaterOrEqual(t, ps["gonixl_held_time_seconds_sum"], ds["gonixl_xfer_wait_time_seconds_sum"], "blocks are held at least while they are read")
	assert.Positive(t, ds["gonixl_bytes_total"])
	assert.Equal(t, ps["gonixl_bytes_total"], ds["gonixl_bytes_total"])
}

// Each counter is exported under its own name and read by the method of that name: the fields, the name table
// and the accessors cannot drift apart.
func TestMetricsCounterNames(t *testing.T) {
	var m Metrics
	type counter struct {
		field *atomic.Int64
		read  func() int64
	}
	counters := map[string]counter{
		"gonixl_requests_total": {&m.requests, m.Requests}, "gonixl_request_errors_total": {&m.requestErrors, m.RequestErrors},
		"gonixl_bytes_total": {&m.bytes, m.Bytes}, "gonixl_blocks_held": {&m.blocksHeld, m.BlocksHeld},
		"gonixl_blocks_freed_total": {&m.blocksFreed, m.BlocksFreed}, "gonixl_blocks_expired_total": {&m.blocksExpired, m.BlocksExpired},
		"gonixl_kv_expired_reqs_total": {&m.requestsExpired, m.RequestsExpired}, "gonixl_heartbeats_total": {&m.heartbeats, m.Heartbeats},
		"gonixl_notifications_total": {&m.notifications, m.Notifications}, "gonixl_bad_messages_total": {&m.badMessages, m.BadMessages},
		"gonixl_rejected_notifications_total": {&m.rejectedNotifications, m.RejectedNotifications},
		"gonixl_handshakes_total":             {&m.handshakes, m.Handshakes},
		"gonixl_remote_agent_conflicts_total": {&m.agentConflicts, m.AgentConflicts},
		"gonixl_forged_notifications_total":   {&m.forgedNotifications, m.ForgedNotifications},
		"gonixl_prefix_cache_queries_total":   {&m.prefixQueries, m.PrefixCacheQueries},
		"gonixl_prefix_cache_hits_total":      {&m.prefixHits, m.PrefixCacheHits},
		"gonixl_prefix_cache_misses_total":    {&m.prefixMisses, m.PrefixCacheMisses},
		"gonixl_prefix_cache_evictions_total": {&m.prefixEvictions, m.PrefixCacheEvictions},
		"gonixl_prefix_cache_blocks":          {&m.prefixBlocks, m.PrefixCacheBlocks},
		"gonixl_kv_events_published_total":    {&m.kvEventsPublished, m.KVEventsPublished},
		"gonixl_kv_events_dropped_total":      {&m.kvEventsDropped, m.KVEventsDropped},
	}
	require.Len(t, counters, len(counterInfos))
	i := int64(1)
	for _, c := range counters {
		c.field.Store(i)
		i++
	}
	s := gather(t, &m)
	seen := map[int64]bool{}
	for name, c := range counters {
		v := c.field.Load()
		seen[v] = true
		assert.EqualValues(t, v, s[name], name)
		assert.Equal(t, v, c.read(), name)
	}
	assert.Len(t, seen, len(counters), "one field per counter")
}
