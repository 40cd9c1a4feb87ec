package connector

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Metrics counts what the roles do. One Metrics can be shared by several roles; the zero value is ready.
// All methods are safe for concurrent use. Handler serves them in Prometheus' text format.
type Metrics struct {
	Requests        atomic.Int64 // prefill: requests published; decode: requests pulled
	RequestErrors   atomic.Int64 // requests that failed
	Bytes           atomic.Int64 // bytes read (decode) or published (prefill)
	BlocksHeld      atomic.Int64 // prefill: blocks currently held for decode peers
	BlocksFreed     atomic.Int64 // prefill: blocks freed after the decode peers' notifications
	BlocksExpired   atomic.Int64 // prefill: blocks freed at lease expiry / abort timeout
	RequestsExpired atomic.Int64 // prefill: requests whose blocks expired
	Heartbeats      atomic.Int64 // heartbeats sent (decode) or received (prefill)
	Notifications   atomic.Int64 // transfer notifications received (prefill)
	BadMessages     atomic.Int64 // malformed or unknown notifications (prefill)
	// RejectedNotifications counts notifications from agents outside PrefillConfig.NotifyFrom (prefill).
	RejectedNotifications atomic.Int64
	Handshakes            atomic.Int64 // decode: handshakes done (cache misses)

	mu    sync.Mutex
	hists map[string]*summary
}

type summary struct {
	count int64
	sum   time.Duration
	max   time.Duration
}

// Observe records a latency under name (e.g. "handshake", "transfer", "stage").
func (m *Metrics) Observe(name string, d time.Duration) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hists == nil {
		m.hists = map[string]*summary{}
	}
	s := m.hists[name]
	if s == nil {
		s = &summary{}
		m.hists[name] = s
	}
	s.count++
	s.sum += d
	if d > s.max {
		s.max = d
	}
}

// Latency returns the count, mean and max of a latency.
func (m *Metrics) Latency(name string) (count int64, mean, max time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.hists[name]
	if s == nil || s.count == 0 {
		return 0, 0, 0
	}
	return s.count, s.sum / time.Duration(s.count), s.max
}

// WritePrometheus writes the metrics in Prometheus' text exposition format.
func (m *Metrics) WritePrometheus(w io.Writer) {
	counters := []struct {
		name, help string
		v          *atomic.Int64
		gauge      bool
	}{
		{"gonixl_requests_total", "Requests published (prefill) or pulled (decode).", &m.Requests, false},
		{"gonixl_request_errors_total", "Requests that failed.", &m.RequestErrors, false},
		{"gonixl_bytes_total", "KV bytes read (decode) or published (prefill).", &m.Bytes, false},
		{"gonixl_blocks_held", "KV blocks held for decode peers.", &m.BlocksHeld, true},
		{"gonixl_blocks_freed_total", "KV blocks freed after the decode peers' notifications.", &m.BlocksFreed, false},
		{"gonixl_blocks_expired_total", "KV blocks freed at lease expiry or abort timeout.", &m.BlocksExpired, false},
		{"gonixl_requests_expired_total", "Requests whose blocks expired unread.", &m.RequestsExpired, false},
		{"gonixl_heartbeats_total", "Lease heartbeats sent (decode) or received (prefill).", &m.Heartbeats, false},
		{"gonixl_notifications_total", "Transfer notifications received.", &m.Notifications, false},
		{"gonixl_bad_messages_total", "Malformed or unknown notifications.", &m.BadMessages, false},
		{"gonixl_rejected_notifications_total", "Notifications from agents outside the prefill worker's allow-list.", &m.RejectedNotifications, false},
		{"gonixl_handshakes_total", "Side-channel handshakes done.", &m.Handshakes, false},
	}
	for _, c := range counters {
		kind := "counter"
		if c.gauge {
			kind = "gauge"
		}
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", c.name, c.help, c.name, kind, c.name, c.v.Load())
	}
	m.mu.Lock()
	names := make([]string, 0, len(m.hists))
	for n := range m.hists {
		names = append(names, n)
	}
	sort.Strings(names)
	// Each family is one contiguous group (the text format requires it): the summary, then the maxima.
	fmt.Fprintf(w, "# HELP gonixl_latency_seconds Latencies of handshakes, stagings and transfers.\n# TYPE gonixl_latency_seconds summary\n")
	for _, n := range names {
		s := m.hists[n]
		op := promLabel(n)
		fmt.Fprintf(w, "gonixl_latency_seconds_sum{op=\"%s\"} %g\ngonixl_latency_seconds_count{op=\"%s\"} %d\n", op, s.sum.Seconds(), op, s.count)
	}
	fmt.Fprintf(w, "# HELP gonixl_latency_max_seconds Longest handshake, staging and transfer seen.\n# TYPE gonixl_latency_max_seconds gauge\n")
	for _, n := range names {
		fmt.Fprintf(w, "gonixl_latency_max_seconds{op=\"%s\"} %g\n", promLabel(n), m.hists[n].max.Seconds())
	}
	m.mu.Unlock()
}

// promLabel escapes a label value as the text format wants it: only \\, \" and \n (Go's %q would write
// \t or \u escapes that Prometheus does not read).
func promLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

// Handler serves the metrics (mount it at /metrics).
func (m *Metrics) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		m.WritePrometheus(w)
	})
}
