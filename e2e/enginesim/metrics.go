package enginesim

import "github.com/prometheus/client_golang/prometheus"

// simMetrics holds every metric the simulator exports: vLLM's names with
// vLLM's labels (model_name, engine), plus the simulator's proof counters.
type simMetrics struct {
	running, waiting, kvUsage           prometheus.Gauge
	prefixQueries, prefixHits           prometheus.Counter
	promptTokens, generationTokens      prometheus.Counter
	ttft, e2e                           prometheus.Observer
	requestSuccess                      *prometheus.CounterVec
	nixlXferTime, nixlBytes             prometheus.Observer
	nixlFailed                          prometheus.Counter
	kvBlocksHeld                        prometheus.Gauge
	remoteDecodePrefills                prometheus.Counter
	remoteKVDecodes                     prometheus.Counter
	kvHandshakes                        prometheus.Counter
	localPrefillTokens                  prometheus.Counter
	prefillsComputed                    prometheus.Counter
	invalidKVParams                     prometheus.Counter
	placeholderDecodes                  prometheus.Counter
	remoteLayouts                       *prometheus.CounterVec
	kvLoadFailures                      *prometheus.CounterVec
	leaseExpired                        prometheus.Counter
	bootstrapPrefills, bootstrapDecodes prometheus.Counter
	mooncakePrefills, mooncakeDecodes   prometheus.Counter
	mooncakeQueries, kvReleasedOnCancel prometheus.Counter
	sharedStoredBlocks                  prometheus.Counter
	sharedLoadedBlocks, sharedLoads     prometheus.Counter
	thresholdDeclines                   prometheus.Counter
	p2pHolds                            prometheus.Counter
	p2pBlocksServed, p2pPulls           *prometheus.CounterVec
	p2pBlocksPulled, p2pPullFailures    *prometheus.CounterVec
	faultsInjected                      *prometheus.CounterVec
	badRequests                         *prometheus.CounterVec
	continuedMessages                   prometheus.Counter
	requestsCancelled                   *prometheus.CounterVec
	prefillComputedTokens               prometheus.Counter
	// Bidirectional KV transfer (bidirectional.go).
	bidiPins, bidiHistoryPulls             prometheus.Counter
	bidiHistoryBlocks, bidiHistoryFailures prometheus.Counter
	bidiRecomputed                         prometheus.Counter
	// The Responses API's response store (responses.go).
	previousResponses *prometheus.CounterVec
	responsesStored   prometheus.Gauge
}

func newSimMetrics(reg prometheus.Registerer, model string) *simMetrics {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
		reg.MustRegister(g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		reg.MustRegister(c)
		return c
	}
	counterVec := func(name, help string, l ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, l)
		reg.MustRegister(c)
		return c
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
		reg.MustRegister(h)
		return h
	}
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	m := &simMetrics{
		running:              gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:              gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:              gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		prefixQueries:        counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:           counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		promptTokens:         counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens:     counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		ttft:                 hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", latency),
		e2e:                  hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", latency),
		requestSuccess:       counterVec("vllm:request_success_total", "Count of successfully processed requests.", "finished_reason"),
		nixlXferTime:         hist("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", latency),
		nixlBytes:            hist("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.", prometheus.ExponentialBuckets(1024, 4, 12)),
		nixlFailed:           counter("vllm:nixl_num_failed_transfers_total", "Number of failed NIXL KV Cache transfers."),
		kvBlocksHeld:         gauge("sim_kv_blocks_held", "KV blocks held for remote decoders, and with bidirectional KV transfer pinned for the next turn's prefill (stranded KV when it does not return to 0)."),
		remoteDecodePrefills: counter("sim_remote_decode_prefills_total", "Prefills done for a remote decoder (do_remote_decode or SGLang room)."),
		remoteKVDecodes:      counter("sim_remote_kv_decodes_total", "Decodes that used KV pulled from a remote prefiller."),
		kvHandshakes:         counter("sim_kv_handshakes_total", "NIXL handshakes with prefiller engines: first pulls from a remote_engine_id not connected yet (each waits --kv-handshake-delay)."),
		localPrefillTokens:   counter("sim_local_prefill_tokens_total", "Prompt tokens this engine prefilled itself (cache hits included)."),
		prefillsComputed:     counter("sim_prefills_computed_total", "Prefills that started computing on this engine (local requests, prefill legs, recomputes; a prefix cache hit of the whole prompt is none), finished or not."),
		invalidKVParams:      counter("sim_invalid_kv_params_total", "Requests whose kv_transfer_params were invalid (prefilled locally, as vLLM does)."),
		placeholderDecodes:   counter("sim_placeholder_kv_decodes_total", "Decodes of llm-d-inference-sim's placeholder kv_transfer_params (--wire-shape llm-d-inference-sim-*): the prefill's cost skipped, nothing pulled."),
		remoteLayouts:        counterVec("sim_remote_kv_layouts_total", "Decodes on pulled NIXL KV by the prefill engine's layout their params named (tp_size, dcp_size, pp_size; \"\" where absent).", "tp_size", "dcp_size", "pp_size"),
		kvLoadFailures:       counterVec("sim_kv_load_failures_total", "Failed KV loads on the decode side, by the policy applied.", "policy"),
		leaseExpired:         counter("sim_kv_lease_expired_total", "Holds of KV blocks that ended at lease expiry, not by a pull."),
		bootstrapPrefills:    counter("sim_sglang_prefills_total", "Prefills registered under an SGLang bootstrap room."),
		bootstrapDecodes:     counter("sim_sglang_decodes_total", "Decodes that pulled KV through an SGLang bootstrap room."),
		mooncakePrefills:     counter("sim_mooncake_prefills_total", "Prefills registered under a Mooncake transfer_id."),
		mooncakeDecodes:      counter("sim_mooncake_decodes_total", "Decodes that pulled KV by a Mooncake transfer_id."),
		mooncakeQueries:      counter("sim_mooncake_bootstrap_queries_total", "GET /query answered on the bootstrap port."),
		kvReleasedOnCancel:   counter("sim_kv_released_on_cancel_total", "Holds freed because their prefill request was cancelled before the pull."),
		sharedStoredBlocks:   counter("sim_shared_storage_stored_blocks_total", "KV blocks written to the shared storage."),
		sharedLoadedBlocks:   counter("sim_shared_storage_loaded_blocks_total", "KV blocks read from the shared storage instead of computed."),
		sharedLoads:          counter("sim_shared_storage_loads_total", "Requests that read KV from the shared storage."),
		thresholdDeclines:    counter("sim_cache_threshold_declines_total", "Requests declined with finish_reason cache_threshold."),
		faultsInjected:       counterVec("sim_faults_injected_total", "Faults injected, by kind.", "kind"),
		badRequests:          counterVec("sim_bad_requests_total", "Requests refused as invalid, by status.", "code"),
		continuedMessages:    counter("sim_continued_messages_total", "Chat requests that continued their final assistant message (continue_final_message)."),
		p2pHolds:             counter("sim_p2p_holds_total", "Prefills that held their KV under a remote_decoder kv_request_id for a P2P pull."),
		p2pBlocksServed:      counterVec("sim_p2p_blocks_served_total", "KV blocks served to P2P pullers (counted once the puller read them all), by kind.", "kind"),
		p2pPulls:             counterVec("sim_p2p_pulls_total", "Completed P2P pulls, by kind (prefill: remote_prefiller; source: remote_kv_source).", "kind"),
		p2pBlocksPulled:      counterVec("sim_p2p_blocks_pulled_total", "KV blocks pulled over the P2P tier, by kind.", "kind"),
		p2pPullFailures:      counterVec("sim_p2p_pull_failures_total", "Failed P2P pulls, by kind.", "kind"),
		requestsCancelled: counterVec("sim_requests_cancelled_total",
			"Inference requests whose client left before the answer was finished (work stopped, KV freed), by leg kind (prefill, decode, local).", "kind"),
		prefillComputedTokens: counter("sim_prefill_computed_tokens_total",
			"Prompt tokens this engine computed in prefills: the prompt less prefix-cache hits, blocks loaded from the shared storage and history pulled from a decode engine."),
		bidiPins: counter("sim_bidirectional_pins_total",
			"Decode legs that pinned their sequence's KV for the next turn's prefill (bidirectional KV transfer)."),
		bidiHistoryPulls: counter("sim_bidirectional_history_pulls_total",
			"Prefill legs that pulled their history's KV from the decode engine that pinned it."),
		bidiHistoryBlocks: counter("sim_bidirectional_history_blocks_pulled_total",
			"KV blocks of histories pulled from decode engines."),
		bidiHistoryFailures: counter("sim_bidirectional_history_pull_failures_total",
			"Failed history pulls (pin expired or unknown, decode engine unreachable); kv_load_failure_policy decides the request's fate."),
		bidiRecomputed: counter("sim_bidirectional_recomputed_below_threshold_total",
			"Prefill legs whose history to pull was shorter than --kv-recompute-threshold tokens: recomputed, nothing pulled."),
		previousResponses: counterVec("sim_previous_responses_total",
			"Responses requests that named a previous_response_id, by result (found: its conversation prepended; unknown: answered 404).", "result"),
		responsesStored: gauge("sim_responses_stored",
			"Responses answers kept for a later previous_response_id (at most --responses-store)."),
	}
	// Both kinds are exported from the start, so a scrape shows 0.
	for _, k := range []string{p2pPrefill, p2pSource} {
		m.p2pBlocksServed.WithLabelValues(k)
		m.p2pPulls.WithLabelValues(k)
		m.p2pBlocksPulled.WithLabelValues(k)
		m.p2pPullFailures.WithLabelValues(k)
	}
	for _, k := range []legKind{legPrefill, legDecode, legLocal} {
		m.requestsCancelled.WithLabelValues(k.label())
	}
	for _, r := range []string{"found", "unknown"} {
		m.previousResponses.WithLabelValues(r)
	}
	return m
}
