package connector

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

func TestBlockPool(t *testing.T) {
	p := NewBlockPool(8) // ids 1..7; 0 is the null block
	assert.Equal(t, 7, p.Available())
	assert.Zero(t, p.InUse())

	a, err := p.Alloc(3)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3}, a, "lowest ids first")
	b, err := p.Alloc(4)
	require.NoError(t, err)
	assert.Equal(t, 7, p.InUse())
	assert.Zero(t, p.Available())
	for _, id := range append(a, b...) {
		assert.NotZero(t, id, "block 0 is never handed out")
	}

	_, err = p.Alloc(1)
	require.ErrorIs(t, err, ErrNoBlocks)
	assert.Contains(t, err.Error(), "want 1, 0 of 7 free")
	_, err = p.Alloc(-1)
	require.ErrorIs(t, err, ErrNoBlocks)
	none, err := p.Alloc(0)
	require.NoError(t, err)
	assert.Empty(t, none)

	p.Free(a)
	p.Free(a)                // a double free is ignored
	p.Free([]int{0, 99, -1}) // ids never handed out are ignored
	assert.Equal(t, 3, p.Available())
	assert.Equal(t, 4, p.InUse())
	c, err := p.Alloc(3)
	require.NoError(t, err)
	assert.ElementsMatch(t, a, c)
	_, err = p.Alloc(1)
	require.ErrorIs(t, err, ErrNoBlocks, "the double free did not make a block available twice")

	assert.Zero(t, NewBlockPool(1).Available(), "a cache with only the null block has nothing to hand out")
	assert.Zero(t, NewBlockPool(0).Available())
}

func TestBlockPoolConcurrent(t *testing.T) {
	p := NewBlockPool(65)
	var wg sync.WaitGroup
	var mu sync.Mutex
	owner := map[int]int{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				ids, err := p.Alloc(1 + i%8)
				if err != nil {
					continue
				}
				mu.Lock()
				for _, id := range ids {
					if o, ok := owner[id]; ok {
						t.Errorf("block %d handed to goroutine %d while goroutine %d holds it", id, g, o)
					}
					owner[id] = g
				}
				mu.Unlock()
				mu.Lock()
				for _, id := range ids {
					delete(owner, id)
				}
				mu.Unlock()
				p.Free(ids)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 64, p.Available())
	assert.Zero(t, p.InUse())
}

func TestParseBackends(t *testing.T) {
	assert.Equal(t, []nixl.BackendSpec{{Plugin: "LIBFABRIC"}}, ParseBackends([]string{"LIBFABRIC"}))
	ucx, err := nixl.DefaultUCXOptions().Spec()
	require.NoError(t, err)
	assert.Equal(t, []nixl.BackendSpec{ucx, {Plugin: "LIBFABRIC"}}, ParseBackends([]string{" ucx ", "", "libfabric"}))
	assert.Empty(t, ParseBackends(nil))
	assert.Empty(t, ParseBackends([]string{" ", ""}))
	assert.Equal(t, []nixl.BackendSpec{ucx}, DefaultBackends)
	assert.Contains(t, ucx.Params["engine_config"], "RMA_PPLN_ENABLE=y", "RMA pipeline on by default")
}

func TestPlanFor(t *testing.T) {
	want := map[protocol.LayoutEra]layout.RegionPlan{protocol.LayoutA: layout.PlanSplitKV,
		protocol.LayoutB: layout.PlanKVHalves, protocol.LayoutC: layout.PlanPackedKV}
	for _, p := range protocol.Profiles {
		plan, err := PlanFor(p)
		require.NoError(t, err, p.Name)
		assert.Equal(t, want[p.Layout], plan, p.Name)
	}
	plan, err := PlanFor(protocol.Profile{Name: "era-b", Layout: protocol.LayoutB})
	require.NoError(t, err)
	assert.Equal(t, layout.PlanKVHalves, plan)
	_, err = PlanFor(protocol.Profile{Name: "future"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "future")

	// The roles refuse a cache whose plan is not the profile's era.
	p16, _ := protocol.ProfileByName("0.16")
	g, err := geomFor(p16, 4)
	require.NoError(t, err)
	g.Plan = layout.PlanPackedKV
	err = checkPlan(p16, fakeCache{g})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "packed-kv")
	require.Error(t, checkPlan(p16, nil))
}

type fakeCache struct{ g layout.Geometry }

func (c fakeCache) Geometry() layout.Geometry { return c.g }
func (fakeCache) MemType() nixl.MemType       { return nixl.DRAM }
func (fakeCache) DeviceID() uint64            { return 0 }
func (fakeCache) RegionBases() []uint64       { return nil }

// A heartbeat extends a lease by 2/3 of it, as vLLM does (30 s lease → 20 s), also for the default lease, whose
// nanosecond product overflows int64.
func TestLeaseExtension(t *testing.T) {
	p33, _ := protocol.ProfileByName("0.33")
	p16, _ := protocol.ProfileByName("0.16")
	for _, c := range []struct {
		p    protocol.Profile
		hold time.Duration
		want time.Duration
	}{
		{p33, p33.LeaseDuration, 20 * time.Second},
		{p33, 3 * time.Second, 2 * time.Second},
		{p33, 10 * time.Minute, 400 * time.Second},
		{p16, time.Second, time.Second},
	} {
		pr := &Prefill{cfg: PrefillConfig{Profile: c.p}, hold: c.hold}
		assert.InDelta(t, float64(c.want), float64(pr.leaseExtension()), float64(time.Microsecond), "%s hold %v", c.p.Name, c.hold)
	}
}

// promLine is one sample line of the text exposition format.
var promLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? (\S+)$`)

// parseProm checks Prometheus' text format strictly (HELP/TYPE before samples, each family in one group,
// sample names belonging to their family's type) and returns the samples by "name{labels}".
func parseProm(t *testing.T, r io.Reader) (map[string]float64, map[string]string) {
	t.Helper()
	samples := map[string]float64{}
	types := map[string]string{}
	done := map[string]bool{}
	cur := ""
	family := func(name string) string {
		for _, suf := range []string{"_sum", "_count", "_bucket"} {
			if base, ok := strings.CutSuffix(name, suf); ok && (types[base] == "summary" || types[base] == "histogram") {
				return base
			}
		}
		return name
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			f := strings.Fields(line)
			require.GreaterOrEqual(t, len(f), 4, line)
			name := f[2]
			if name != cur {
				require.False(t, done[name], "family %s appears in two groups", name)
				if cur != "" {
					done[cur] = true
				}
				cur = name
			}
			if f[1] == "TYPE" {
				require.NotContains(t, types, name, "second TYPE for %s", name)
				require.Contains(t, []string{"counter", "gauge", "summary", "histogram", "untyped"}, f[3])
				types[name] = f[3]
			}
			continue
		}
		m := promLine.FindStringSubmatch(line)
		require.NotNil(t, m, "not a valid sample line: %q", line)
		fam := family(m[1])
		if fam != cur {
			require.False(t, done[fam], "samples of %s are split into two groups (line %q)", fam, line)
			if cur != "" {
				done[cur] = true
			}
			cur = fam
		}
		v, err := strconv.ParseFloat(m[3], 64)
		require.NoError(t, err, line)
		samples[m[1]+m[2]] = v
	}
	require.NoError(t, sc.Err())
	return samples, types
}

func TestMetricsPrometheus(t *testing.T) {
	var m Metrics
	s, types := parseProm(t, strings.NewReader(promText(&m)))
	assert.Equal(t, "counter", types["gonixl_requests_total"])
	assert.Equal(t, "gauge", types["gonixl_blocks_held"])
	assert.Equal(t, "summary", types["gonixl_latency_seconds"])
	assert.Zero(t, s["gonixl_requests_total"])

	m.Requests.Add(3)
	m.Bytes.Add(1 << 20)
	m.BlocksHeld.Add(5)
	m.BlocksHeld.Add(-2)
	m.BlocksExpired.Add(4)
	m.RequestsExpired.Add(1)
	m.Handshakes.Add(1)
	m.Observe("transfer", 2*time.Millisecond)
	m.Observe("transfer", 4*time.Millisecond)
	m.Observe("handshake", 30*time.Millisecond)
	var nilM *Metrics
	nilM.Observe("x", time.Second) // a nil Metrics ignores observations

	n, mean, maxd := m.Latency("transfer")
	assert.EqualValues(t, 2, n)
	assert.Equal(t, 3*time.Millisecond, mean)
	assert.Equal(t, 4*time.Millisecond, maxd)
	n, _, _ = m.Latency("never")
	assert.Zero(t, n)

	// Through the HTTP handler, as Prometheus scrapes it.
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/plain; version=0.0.4", resp.Header.Get("Content-Type"))
	s, _ = parseProm(t, resp.Body)
	assert.EqualValues(t, 3, s["gonixl_requests_total"])
	assert.EqualValues(t, 1<<20, s["gonixl_bytes_total"])
	assert.EqualValues(t, 3, s["gonixl_blocks_held"])
	assert.EqualValues(t, 4, s["gonixl_blocks_expired_total"])
	assert.EqualValues(t, 1, s["gonixl_requests_expired_total"])
	assert.EqualValues(t, 1, s["gonixl_handshakes_total"])
	assert.EqualValues(t, 2, s[`gonixl_latency_seconds_count{op="transfer"}`])
	assert.InDelta(t, 0.006, s[`gonixl_latency_seconds_sum{op="transfer"}`], 1e-12)
	assert.EqualValues(t, 1, s[`gonixl_latency_seconds_count{op="handshake"}`])
	assert.InDelta(t, 0.004, s[`gonixl_latency_max_seconds{op="transfer"}`], 1e-12)
	assert.InDelta(t, 0.03, s[`gonixl_latency_max_seconds{op="handshake"}`], 1e-12)

	// Every counter of the struct is exported.
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, want := range []string{"gonixl_request_errors_total", "gonixl_blocks_freed_total", "gonixl_heartbeats_total",
		"gonixl_notifications_total", "gonixl_bad_messages_total", "gonixl_rejected_notifications_total"} {
		assert.Contains(t, names, want)
	}
}

// An op name with characters that need escaping still gives a valid exposition.
func TestMetricsPrometheusEscaping(t *testing.T) {
	var m Metrics
	m.Observe("a\"b\\c\nd\té", time.Millisecond)
	s, _ := parseProm(t, strings.NewReader(promText(&m)))
	assert.EqualValues(t, 1, s["gonixl_latency_seconds_count{op=\"a\\\"b\\\\c\\nd\té\"}"])
}

func promText(m *Metrics) string {
	var b strings.Builder
	m.WritePrometheus(&b)
	return b.String()
}

// The roles' counters as Prometheus text after real traffic.
func TestMetricsAfterTraffic(t *testing.T) {
	p, _ := protocol.ProfileByName("0.16")
	pr := newPair(t, p, pairOpts{})
	ctx := ctxT(t, 10*time.Second)
	kv, err := pr.pre.Prefill(ctx, "m1", 2*tinyBlock, nil)
	require.NoError(t, err)
	before, _ := parseProm(t, strings.NewReader(promText(pr.preM)))
	assert.EqualValues(t, 2, before["gonixl_blocks_held"])
	_, err = pr.dec.Pull(ctx, "m1", kv, []int{1, 2})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
	ps, _ := parseProm(t, strings.NewReader(promText(pr.preM)))
	ds, _ := parseProm(t, strings.NewReader(promText(pr.decM)))
	assert.EqualValues(t, 0, ps["gonixl_blocks_held"])
	assert.EqualValues(t, 2, ps["gonixl_blocks_freed_total"])
	assert.EqualValues(t, 1, ps["gonixl_notifications_total"])
	assert.EqualValues(t, 1, ps[`gonixl_latency_seconds_count{op="stage"}`])
	assert.EqualValues(t, 1, ds["gonixl_requests_total"])
	assert.EqualValues(t, 1, ds["gonixl_handshakes_total"])
	assert.EqualValues(t, 1, ds[`gonixl_latency_seconds_count{op="handshake"}`])
	assert.EqualValues(t, 1, ds[`gonixl_latency_seconds_count{op="transfer"}`])
	assert.Equal(t, ps["gonixl_bytes_total"], ds["gonixl_bytes_total"])
}
