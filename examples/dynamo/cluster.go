package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/examples/internal/demo"
)

// clusterConfig says how to run gonixl's Go workers behind NVIDIA Dynamo on one host.
type clusterConfig struct {
	Self        string   // a binary that serves `serve-prefill ARGS...` and `serve-decode ARGS...` (this program)
	Python      string   // the interpreter of the Dynamo virtualenv (make dynamo)
	Worker      string   // python/dynamo_worker.py
	Dir         string   // working folder: discovery records, model, request records, logs (the caller removes it)
	GoArgs      []string // flags both Go workers get (-vllm-version, -num-blocks, -kv-layout, ...)
	PrefillArgs []string // flags only the Go prefills get (-max-seq, -batch-rows, -prefix-cache-blocks, -kv-events)
	DecodeArgs  []string // flags only the Go decode gets (-cache)
	Prefills    int      // Go prefill workers, each with a Dynamo prefill worker in front (0: 1)
	Context     int      // context length the workers advertise (the Go prefill's -max-seq)
	KVBlocks    int      // KV blocks the workers advertise (-num-blocks)
	MaxSeqs     int      // concurrent sequences the workers advertise (-batch-rows)
	CallTimeout time.Duration
	Model       string // served model name
}

// cluster is the running set: the event-plane broker, the Go prefill workers and the Go decode worker, a
// Dynamo worker in front of each, and Dynamo's frontend.
type cluster struct {
	cfg                    clusterConfig
	env                    []string
	broker                 *demo.Proc
	goPrefills             []*demo.Proc // Go prefill i is PrefillNames[i]
	goDecode               *demo.Proc
	dynPrefills            []*demo.Proc // in front of goPrefills[i]
	dynDecode              *demo.Proc
	frontend               *demo.Proc
	URL                    string   // the frontend's base URL
	GoPrefillURLs          []string // the Go prefills' base URLs
	PrefillNames           []string // "prefill-0", ...: the worker each prefill record names
	PrefillEngines         []string // the Go prefills' engine ids (remote_engine_id in their kv_transfer_params)
	GoDecodeURL            string
	Started                map[string]time.Duration // how long each part took to be ready
	prefillRecs            []string
	decodeRec              string
	httpc                  *http.Client
	discoveryDir, modelDir string
}

// loopbackEnv is the environment that keeps every Dynamo server on 127.0.0.1: file discovery under dir, the TCP
// request plane, and the ZMQ event plane through the loopback broker (Dynamo's direct ZMQ mode binds 0.0.0.0).
func loopbackEnv(discovery, brokerURL string) []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DYN_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"DYN_FILE_KV="+discovery, "DYN_DISCOVERY_BACKEND=file", "DYN_REQUEST_PLANE=tcp", "DYN_EVENT_PLANE=zmq",
		"DYN_ZMQ_BROKER_URL="+brokerURL,
		"DYN_EVENT_PLANE_HOST=127.0.0.1", "DYN_TCP_RPC_HOST=127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1",
		"DYN_SYSTEM_HOST=127.0.0.1", "DYN_HTTP_HOST=127.0.0.1",
		"DYN_SELF_HOST_METADATA=0",                  // model cards in the discovery folder, no metadata server
		"DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS=1", // unregister, then 1 s before draining
		"HF_HUB_OFFLINE=1",                          // the model folder is local; never reach for the Hub
		"UCX_NET_DEVICES=lo",                        // NIXL's UCX between the Go workers: loopback only
	)
}

// startCluster starts everything and waits until the frontend routes to both workers. On error it stops what
// it started.
func startCluster(ctx context.Context, cfg clusterConfig) (c *cluster, err error) {
	c = &cluster{cfg: cfg, Started: map[string]time.Duration{}, httpc: &http.Client{},
		discoveryDir: filepath.Join(cfg.Dir, "discovery"), modelDir: filepath.Join(cfg.Dir, "model"),
		decodeRec: filepath.Join(cfg.Dir, "decode-records.jsonl")}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	logf := func(name string) string { return filepath.Join(cfg.Dir, name+".log") }
	base := loopbackEnv(c.discoveryDir, "")
	if out, err := exec.CommandContext(ctx, cfg.Python, cfg.Worker, "make-model", c.modelDir, "--context-length",
		strconv.Itoa(cfg.Context)).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make-model: %v: %s", err, out)
	}

	t := time.Now()
	if c.broker, err = demo.StartProc("event-plane broker", logf("broker"), base, cfg.Python, cfg.Worker, "broker"); err != nil {
		return nil, err
	}
	line, err := c.broker.WaitReady(ctx)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(line) // xsub=tcp://127.0.0.1:P xpub=tcp://127.0.0.1:Q
	if len(f) != 2 {
		return nil, fmt.Errorf("broker: unexpected READY line %q", line)
	}
	c.env = loopbackEnv(c.discoveryDir, f[0]+" , "+f[1])
	c.Started["broker"] = time.Since(t)

	t = time.Now()
	n := max(cfg.Prefills, 1)
	c.goPrefills, c.dynPrefills = make([]*demo.Proc, n), make([]*demo.Proc, n)
	c.GoPrefillURLs, c.PrefillEngines = make([]string, n), make([]string, n)
	type worker struct {
		spec demo.WorkerSpec
		p    **demo.Proc
		url  *string
		info *string
	}
	var workers []worker
	for i := range n {
		name := "prefill-" + strconv.Itoa(i)
		c.PrefillNames = append(c.PrefillNames, name)
		c.prefillRecs = append(c.prefillRecs, filepath.Join(cfg.Dir, name+"-records.jsonl"))
		workers = append(workers, worker{demo.WorkerSpec{Name: "Go " + name, Self: cfg.Self, Role: "prefill", Args: slices.Concat(cfg.GoArgs, cfg.PrefillArgs),
			Log: logf("go-" + name), Env: c.env}, &c.goPrefills[i], &c.GoPrefillURLs[i], &c.PrefillEngines[i]})
	}
	workers = append(workers, worker{demo.WorkerSpec{Name: "Go decode", Self: cfg.Self, Role: "decode", Args: slices.Concat(cfg.GoArgs, cfg.DecodeArgs),
		Log: logf("go-decode"), Env: c.env}, &c.goDecode, &c.GoDecodeURL, new(string)})
	for _, w := range workers { // all start, then all are waited for
		if *w.p, err = w.spec.Start(); err != nil {
			return nil, err
		}
	}
	for _, w := range workers {
		if *w.url, *w.info, err = w.spec.Ready(ctx, *w.p); err != nil {
			return nil, err
		}
	}
	for i, info := range c.PrefillEngines { // "side-channel=P engine=ID ..." → ID
		c.PrefillEngines[i] = ""
		for _, f := range strings.Fields(info) {
			if id, ok := strings.CutPrefix(f, "engine="); ok {
				c.PrefillEngines[i] = id
			}
		}
	}
	c.Started["Go workers"] = time.Since(t)

	t = time.Now()
	for i := range n {
		if c.dynPrefills[i], err = c.startWorker("prefill", c.PrefillNames[i], c.GoPrefillURLs[i], c.prefillRecs[i]); err != nil {
			return nil, err
		}
	}
	if c.dynDecode, err = c.startWorker("decode", "decode", c.GoDecodeURL, c.decodeRec); err != nil {
		return nil, err
	}
	// The frontend cannot listen on port 0 and say which port it got: take a free port, and take another if
	// something else bound it first (the frontend then exits).
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		c.URL = "http://127.0.0.1:" + strconv.Itoa(port)
		if c.frontend, err = demo.StartProc("Dynamo frontend", logf(fmt.Sprintf("frontend-%d", attempt)), c.env, cfg.Python, "-m",
			"dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", strconv.Itoa(port), "--router-mode", "kv",
			"--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq", "--namespace", "dynamo"); err != nil {
			return nil, err
		}
		err = c.waitRoutable(ctx)
		if err == nil {
			break
		}
		if attempt == 3 || !c.frontend.Exited() || slices.ContainsFunc(c.dynamoWorkers(), (*demo.Proc).Exited) {
			return nil, err
		}
	}
	c.Started["Dynamo frontend and workers"] = time.Since(t)
	return c, nil
}

// startWorker starts the Dynamo worker of role in front of the Go worker at goURL. A prefill worker declares
// its Go worker's KV events (if it publishes any: GET /version says where) to Dynamo.
func (c *cluster) startWorker(role, name, goURL, record string) (*demo.Proc, error) {
	return demo.StartProc("Dynamo "+name+" worker", filepath.Join(c.cfg.Dir, "dynamo-"+name+".log"), c.env,
		c.cfg.Python, c.cfg.Worker, "serve", "--role", role, "--name", name, "--gonixl-url", goURL, "--model-path", c.modelDir,
		"--model-name", c.cfg.Model, "--context-length", strconv.Itoa(c.cfg.Context), "--kv-blocks",
		strconv.Itoa(c.cfg.KVBlocks), "--max-seqs", strconv.Itoa(c.cfg.MaxSeqs), "--timeout",
		strconv.FormatFloat(c.cfg.CallTimeout.Seconds(), 'f', -1, 64), "--record", record)
}

// procs are every process of the set.
func (c *cluster) procs() []*demo.Proc {
	return slices.Concat([]*demo.Proc{c.broker}, c.goPrefills, []*demo.Proc{c.goDecode, c.frontend}, c.dynamoWorkers())
}

// dynamoWorkers are the Dynamo workers, prefills first.
func (c *cluster) dynamoWorkers() []*demo.Proc {
	return append(slices.Clone(c.dynPrefills), c.dynDecode)
}

// waitRoutable waits until the frontend lists the model and every worker's endpoint.
func (c *cluster) waitRoutable(ctx context.Context) error {
	for {
		for _, p := range append([]*demo.Proc{c.frontend}, c.dynamoWorkers()...) {
			if p.Exited() {
				return fmt.Errorf("%s exited (%v); its log: %s", p.Name, p.Err(), p.Tail())
			}
		}
		comps, err := c.Components(ctx)
		if err == nil && comps["prefill"] == len(c.dynPrefills) && comps["backend"] > 0 && c.modelListed(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the frontend did not list both workers: %w (last: %v %v); frontend log: %s", ctx.Err(), comps, err, c.frontend.Tail())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *cluster) modelListed(ctx context.Context) bool {
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := c.getJSON(ctx, c.URL+"/v1/models", &models); err != nil {
		return false
	}
	for _, m := range models.Data {
		if m.ID == c.cfg.Model {
			return true
		}
	}
	return false
}

// Components returns how many instances of each component the frontend's /health lists (the discovery view
// of the frontend: "prefill" and "backend", the decode worker's). An instance that serves several endpoints
// (a prefill worker with KV events also serves Dynamo's KV queries) counts once.
func (c *cluster) Components(ctx context.Context) (map[string]int, error) {
	var h struct {
		Instances []struct {
			Component  string          `json:"component"`
			InstanceID json.RawMessage `json:"instance_id"`
		} `json:"instances"`
	}
	if err := c.getJSON(ctx, c.URL+"/health", &h); err != nil {
		return nil, err
	}
	n := map[string]int{}
	seen := map[string]bool{}
	for _, i := range h.Instances {
		if key := i.Component + "/" + string(i.InstanceID); !seen[key] {
			seen[key] = true
			n[i.Component]++
		}
	}
	return n, nil
}

// Records returns the discovery records in the file-discovery folder whose key names component (e.g.
// "dynamo/prefill/generate").
func (c *cluster) Records(component string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(c.discoveryDir, "v1", "instances"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []string
	key := strings.ReplaceAll(component, "/", "%2F")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), key+"%2F") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (c *cluster) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.httpc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

// completion is what the client saw of one request through the frontend.
type completion struct {
	ID           string // Dynamo's response id, "cmpl-<request id>"
	Text         string
	FinishReason string
	Chunks       int // streamed chunks that carried text
	Latency      time.Duration
}

// RequestID is Dynamo's request id (the response id without its "cmpl-" prefix).
func (r completion) RequestID() string { return strings.TrimPrefix(r.ID, "cmpl-") }

// Complete sends one completion request to the frontend, streamed or not.
func (c *cluster) Complete(ctx context.Context, prompt string, maxTokens int, stream bool) (completion, error) {
	var out completion
	t := time.Now()
	body, _ := json.Marshal(map[string]any{"model": c.cfg.Model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return out, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.httpc.Do(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return out, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	type choice struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	}
	type chunk struct {
		ID      string   `json:"id"`
		Choices []choice `json:"choices"`
	}
	add := func(ch chunk) {
		out.ID = ch.ID
		for _, x := range ch.Choices {
			out.Text += x.Text
			if x.Text != "" {
				out.Chunks++
			}
			if x.FinishReason != "" {
				out.FinishReason = x.FinishReason
			}
		}
	}
	if !stream {
		var ch chunk
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ch); err != nil {
			return out, err
		}
		add(ch)
		out.Latency = time.Since(t)
		return out, nil
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			out.Latency = time.Since(t)
			return out, nil
		}
		var ch chunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return out, fmt.Errorf("stream chunk %q: %w", data, err)
		}
		add(ch)
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	return out, errors.New("the stream ended without [DONE]")
}

// record is one line a Dynamo worker wrote for a request (python/dynamo_worker.py --record).
type record struct {
	Role           string          `json:"role"`
	Worker         string          `json:"worker"`           // the Dynamo worker's --name: "prefill-0", ..., "decode"
	DynamoWorkerID json.RawMessage `json:"dynamo_worker_id"` // Dynamo's id of the worker (a u64: kept as written)
	RequestID      string          `json:"request_id"`
	PromptTokens   int             `json:"prompt_tokens"`
	Emitted        json.RawMessage `json:"emitted"`  // prefill: the disaggregated_params it handed to Dynamo
	Received       json.RawMessage `json:"received"` // decode: the disaggregated_params Dynamo handed to it
	Gonixl         *demo.Timing    `json:"gonixl"`
	MS             float64         `json:"ms"`
}

// RequestRecords reads what the workers recorded, by request id (the prefill workers' records together). Call
// it after the requests completed: each worker writes its line before it answers.
func (c *cluster) RequestRecords() (prefill, decode map[string]record, err error) {
	read := func(path string) (map[string]record, error) {
		m := map[string]record{}
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if line == "" {
				continue
			}
			var r record
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			m[r.RequestID] = r
		}
		return m, nil
	}
	prefill = map[string]record{}
	for _, path := range c.prefillRecs {
		m, err := read(path)
		if err != nil {
			return nil, nil, err
		}
		for id, r := range m {
			if _, dup := prefill[id]; dup {
				return nil, nil, fmt.Errorf("request %s was prefilled by two workers", id)
			}
			prefill[id] = r
		}
	}
	decode, err = read(c.decodeRec)
	return prefill, decode, err
}

// checked is one request's proof: what the prefill handed over, what the decode received and verified.
type checked struct {
	Prefill, Decode record
}

// Check proves one completed request: both workers saw Dynamo's request id, the decode received exactly the
// params the prefill emitted, remote_request_id is Dynamo's request id (with the prefill's suffix), and the Go decode verified every byte
// it READ.
func Check(res completion, tokens int, prefill, decode map[string]record) (checked, error) {
	id := res.RequestID()
	p, ok := prefill[id]
	if !ok {
		return checked{}, fmt.Errorf("request %s: the prefill worker has no record of it", id)
	}
	d, ok := decode[id]
	if !ok {
		return checked{}, fmt.Errorf("request %s: the decode worker has no record of it", id)
	}
	// {"kv_transfer_params": {...}}, as Dynamo's vLLM workers hand them over.
	var emitted, received map[string]map[string]any
	if err := json.Unmarshal(p.Emitted, &emitted); err != nil {
		return checked{}, fmt.Errorf("request %s: prefill params: %w", id, err)
	}
	if err := json.Unmarshal(d.Received, &received); err != nil {
		return checked{}, fmt.Errorf("request %s: decode params: %w", id, err)
	}
	if !reflect.DeepEqual(emitted, received) {
		return checked{}, fmt.Errorf("request %s: the decode received %s, the prefill emitted %s", id, d.Received, p.Emitted)
	}
	// The Go prefill worker appends an unguessable suffix that notifications must carry.
	if got, _ := emitted["kv_transfer_params"]["remote_request_id"].(string); connector.LocalRequestID(got) != id {
		return checked{}, fmt.Errorf("request %s: remote_request_id is %q, not Dynamo's request id", id, got)
	}
	if p.PromptTokens != tokens || d.PromptTokens != tokens {
		return checked{}, fmt.Errorf("request %s: prompt of %d tokens arrived as %d (prefill) and %d (decode)", id, tokens, p.PromptTokens, d.PromptTokens)
	}
	g := d.Gonixl
	if g == nil || !g.Verified || g.Bytes == 0 || g.VerifiedBytes != g.Bytes {
		return checked{}, fmt.Errorf("request %s: the decode did not verify every byte: %+v", id, g)
	}
	return checked{Prefill: p, Decode: d}, nil
}

// close stops everything: the Dynamo workers first (they unregister and drain), then the frontend, the Go
// workers and the broker.
func (c *cluster) close() {
	for _, group := range [][]*demo.Proc{c.dynamoWorkers(), append([]*demo.Proc{c.frontend, c.goDecode, c.broker}, c.goPrefills...)} {
		var wg sync.WaitGroup
		for _, p := range group {
			if p != nil {
				wg.Add(1)
				go func() { defer wg.Done(); p.Stop(30 * time.Second) }()
			}
		}
		wg.Wait()
	}
	c.httpc.CloseIdleConnections()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// sample is one sample of a Prometheus text exposition: a counter, gauge or untyped metric, its labels and
// its value (histograms and summaries are not read).
type sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// metrics reads a /metrics page with Prometheus's own text parser (prometheus/common/expfmt).
func (c *cluster) metrics(ctx context.Context, url string) ([]sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.httpc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: HTTP %d", url, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s/metrics: %w", url, err)
	}
	var out []sample
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			s := sample{Name: name, Labels: map[string]string{}}
			switch {
			case m.Counter != nil:
				s.Value = m.GetCounter().GetValue()
			case m.Gauge != nil:
				s.Value = m.GetGauge().GetValue()
			case m.Untyped != nil:
				s.Value = m.GetUntyped().GetValue()
			default:
				continue
			}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// sum adds the samples of metric name whose labels include every pair of match.
func sum(samples []sample, name string, match map[string]string) float64 {
	var t float64
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			ok = ok && s.Labels[k] == v
		}
		if ok {
			t += s.Value
		}
	}
	return t
}

// routerKV is what Dynamo's frontend reports of its KV router over the prefill workers.
type routerKV struct {
	Applied        map[string]float64 // KV events it applied to its index, by "event_type/status" ("stored/ok", ...)
	SelectedCached float64            // cached prefix tokens of the prefill workers it chose, over all requests
}

// AppliedTotal is how many KV events the router took in, whatever their status.
func (r routerKV) AppliedTotal() float64 {
	var t float64
	for _, v := range r.Applied {
		t += v
	}
	return t
}

// RouterKV reads the frontend's /metrics: dynamo_component_kv_cache_events_applied (component "prefill") and
// dynamo_component_router_kv_selected_cached_prefix_tokens_total (phase "prefill").
func (c *cluster) RouterKV(ctx context.Context) (routerKV, error) {
	m, err := c.metrics(ctx, c.URL)
	if err != nil {
		return routerKV{}, err
	}
	r := routerKV{Applied: map[string]float64{},
		SelectedCached: sum(m, "dynamo_component_router_kv_selected_cached_prefix_tokens_total", map[string]string{"phase": "prefill"})}
	for _, s := range m {
		if s.Name == "dynamo_component_kv_cache_events_applied" && s.Labels["dynamo_component"] == "prefill" {
			r.Applied[s.Labels["event_type"]+"/"+s.Labels["status"]] += s.Value
		}
	}
	return r, nil
}

// GoKVEvents returns, summed over the Go prefill workers, the KV-event batches they published and their
// KV-event subscribers (their /metrics: gonixl_kv_events_published_total, gonixl_kv_events_subscribers), and
// the fewest subscribers any one of them has.
func (c *cluster) GoKVEvents(ctx context.Context) (published, minSubscribers float64, err error) {
	for i, url := range c.GoPrefillURLs {
		m, err := c.metrics(ctx, url)
		if err != nil {
			return 0, 0, err
		}
		published += sum(m, "gonixl_kv_events_published_total", nil)
		if subs := sum(m, "gonixl_kv_events_subscribers", nil); i == 0 || subs < minSubscribers {
			minSubscribers = subs
		}
	}
	return published, minSubscribers, nil
}

// WaitKVRouting waits until every Go prefill has a KV-event subscriber: its Dynamo worker, which relays the
// events to the router. A KV event published before then would be lost (ZMQ PUB/SUB keeps nothing for a
// subscriber yet to come). The router itself takes up a worker's events when it first routes to the prefill
// workers (dynamo_component_router_kv_zmq_ingress_sources counts none before), and fetches what it missed
// from the worker's own indexer.
func (c *cluster) WaitKVRouting(ctx context.Context) error {
	for {
		_, subs, err := c.GoKVEvents(ctx)
		if err == nil && subs >= 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("a Go prefill has no KV-event subscriber (its Dynamo worker): fewest %v (%v)", subs, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// SyncKV waits until the router has taken in every KV event the Go prefills published (one event per batch:
// a prefill's batch holds the BlockStored of one request's new blocks) and returns its view then.
func (c *cluster) SyncKV(ctx context.Context) (routerKV, error) {
	for {
		pub, _, gerr := c.GoKVEvents(ctx)
		r, rerr := c.RouterKV(ctx)
		if gerr == nil && rerr == nil && r.AppliedTotal() >= pub {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("the router applied %v KV events, the Go prefills published %v batches (%v, %v)", r.AppliedTotal(), pub, gerr, rerr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
