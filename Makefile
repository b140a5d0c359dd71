# pd-sidecar: build, test, demo.
GO          ?= go
BIN         := $(CURDIR)/bin
STATICCHECK := $(BIN)/staticcheck
STATICCHECK_VERSION := v0.8.2

.PHONY: all build test lint vet unit demo clean

all: build

## build: compile every binary into ./bin
build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

## test: everything CI runs: gofmt, go vet, staticcheck, and go test -race (unit and e2e over real
## processes). About 10 minutes on 2 cores (the first run also downloads modules and staticcheck).
test: lint deploy-check test-ucx test-rules fuzz-short test-wire-shapes
	@echo "==> go test -race ./... (unit and e2e over real processes; about 16 minutes on 2 cores, the e2e package alone about 15: each package prints when it is done)"
	$(GO) test -race -count=1 -timeout 30m ./...

## test-stress: the e2e and kvtransfer tests on a busy machine and on a fast one, to show that no
## test bets on timing. First -count=$(STRESS_COUNT) while STRESS_HOGS busy loops (default: one per
## core, as `stress-ng --cpu $$(nproc)`) compete for every core, then once with
## GOMAXPROCS=$(STRESS_GOMAXPROCS) and no hog. With libucx-dev, -tags ucx adds the ucx transport's
## tests. STRESS_FLAGS adds go test flags (e.g. -race; -run 'TestLane'). Not part of make test:
## 20-30 minutes on 2 cores, most of it the loaded pass.
STRESS_HOGS       ?= $(shell nproc 2>/dev/null || echo 2)
STRESS_COUNT      ?= 3
STRESS_GOMAXPROCS ?= 16
STRESS_FLAGS      ?=
STRESS_PKGS       := ./e2e/... ./kvtransfer/...
.PHONY: test-stress
test-stress:
	@tags=""; if pkg-config --exists ucx 2>/dev/null; then tags="-tags ucx"; else \
		echo "test-stress: libucx-dev is not installed: the ucx transport's tests are not part of this run"; fi; \
	echo "==> test-stress: building the tests first (no hog)"; \
	$(GO) test $$tags $(STRESS_FLAGS) -count=1 -run '^$$' $(STRESS_PKGS) >/dev/null || exit 1; \
	echo "==> test-stress: $(STRESS_PKGS) -count=$(STRESS_COUNT) under $(STRESS_HOGS) busy loops"; \
	pids=""; for i in $$(seq $(STRESS_HOGS)); do yes >/dev/null & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' EXIT INT TERM; \
	start=$$(date +%s); \
	$(GO) test $$tags $(STRESS_FLAGS) -count=$(STRESS_COUNT) -timeout 90m $(STRESS_PKGS) || exit 1; \
	kill $$pids 2>/dev/null; trap - EXIT INT TERM; \
	echo "==> test-stress: under load in $$(( $$(date +%s) - start )) s; now once with GOMAXPROCS=$(STRESS_GOMAXPROCS) and no hog"; \
	start=$$(date +%s); \
	GOMAXPROCS=$(STRESS_GOMAXPROCS) $(GO) test $$tags $(STRESS_FLAGS) -count=1 -timeout 30m $(STRESS_PKGS) || exit 1; \
	echo "==> test-stress: passed (GOMAXPROCS=$(STRESS_GOMAXPROCS) run: $$(( $$(date +%s) - start )) s)"

## test-ucx: the ucx kvtransfer transport for real (cgo over libucx-dev, -tags ucx): vet and
## staticcheck with the tag, the transport conformance suite and the sidecar-pull e2e over ucx.
## Needs libucx-dev: installed here with apt-get when missing and this user may (root, or
## passwordless sudo); otherwise skipped with a loud note, and everything else still runs.
## UCX_REQUIRED=1 makes a missing libucx-dev an error instead.
## Then the transport's own tests once per UCX_TLS setting that ucx_perftest accepts here
## (UCX_TLS_SETTINGS), each checking that the reads ride the transports it names.
UCX_TLS_SETTINGS := sm,self posix,self sysv,self shm,self tcp tcp,self sm,tcp,self tcp,cma shm,cma,self all ^tcp ^sm
.PHONY: test-ucx
test-ucx: $(STATICCHECK)
	@if ! pkg-config --exists ucx 2>/dev/null; then \
		sudo=""; [ "$$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; } || true; \
		if command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || [ -n "$$sudo" ]; }; then \
			echo "==> test-ucx: installing libucx-dev and pkg-config with apt-get (about a minute)"; \
			$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends libucx-dev pkg-config >/dev/null || true; \
		fi; \
	fi; \
	if ! pkg-config --exists ucx 2>/dev/null; then \
		echo "########################################################################"; \
		echo "# test-ucx: SKIPPED. libucx-dev is not installed and could not be"; \
		echo "# installed here (no apt-get, not root and no passwordless sudo, or the"; \
		echo "# install failed). The ucx transport's tests did NOT run; every other"; \
		echo "# test does. To run them:"; \
		echo "#   sudo apt-get install -y libucx-dev pkg-config && make test-ucx"; \
		echo "########################################################################"; \
		if [ -n "$(UCX_REQUIRED)" ]; then echo "test-ucx: UCX_REQUIRED is set: failing"; exit 1; fi; \
		exit 0; \
	fi; \
	echo "==> test-ucx: vet, staticcheck and the ucx tests (-tags ucx; about a minute)"; \
	set -e; \
	$(GO) vet -tags ucx ./kvtransfer/... ./e2e/; \
	$(STATICCHECK) -tags ucx ./kvtransfer/...; \
	$(GO) test -race -count=1 -timeout 10m -tags ucx -run 'UCX' ./kvtransfer/... ./e2e/; \
	$(GO) test -race -c -tags ucx -o $(BIN)/ucx-transport.test ./kvtransfer/ucx/; \
	for tls in $(UCX_TLS_SETTINGS); do \
		echo "==> test-ucx: the ucx transport's tests with UCX_TLS=$$tls"; \
		UCX_TLS=$$tls $(BIN)/ucx-transport.test -test.count=1 -test.timeout 5m; \
	done; \
	echo "==> test-ucx: the sidecar-pull e2e over shared memory alone (UCX_TLS=sm,self)"; \
	UCX_TLS=sm,self $(GO) test -count=1 -timeout 5m -tags ucx -run 'TestKVPullUCX' ./e2e/

## test-rules: the Prometheus alert and recording rules (deploy/prometheus) checked and unit-tested with
## Debian's promtool (every alert firing and not firing: pd-sidecar-rules.test.yaml). Needs the
## prometheus package: installed here with apt-get when missing and this user may; otherwise skipped
## with a loud note. The same package's prometheus runs the e2e test TestAlertsOverRealTraffic in
## go test ./e2e (skipped loudly without it). PROMETHEUS_REQUIRED=1 makes a missing promtool or
## prometheus an error instead.
.PHONY: test-rules
test-rules:
	@if ! command -v promtool >/dev/null 2>&1; then \
		sudo=""; [ "$$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; } || true; \
		if command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || [ -n "$$sudo" ]; }; then \
			echo "==> test-rules: installing prometheus (promtool) with apt-get"; \
			$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null || true; \
		fi; \
	fi; \
	if ! command -v promtool >/dev/null 2>&1; then \
		echo "########################################################################"; \
		echo "# test-rules: SKIPPED. promtool is not installed and could not be"; \
		echo "# installed here. The alert rules' tests did NOT run, and go test"; \
		echo "# skips TestAlertsOverRealTraffic (a real Prometheus). To run them:"; \
		echo "#   sudo apt-get install -y prometheus && make test"; \
		echo "########################################################################"; \
		if [ -n "$(PROMETHEUS_REQUIRED)" ]; then echo "test-rules: PROMETHEUS_REQUIRED is set: failing"; exit 1; fi; \
		exit 0; \
	fi; \
	echo "==> test-rules: promtool check rules and promtool test rules (deploy/prometheus)"; \
	set -e; cd deploy/prometheus; promtool check rules pd-sidecar-rules.yaml; promtool test rules pd-sidecar-rules.test.yaml

## bench-kv: the KV data plane against its ceilings, side by side in one run (pd-bench kv): for
## each UCX_TLS setting and block size (4KiB..4MiB) ucx_perftest's one-sided get next to the
## sidecar's pull (engine-sim's agent read by `pd-sidecar kv-probe`, both built with -tags ucx),
## then the tcp transport next to a raw one-connection copy and iperf3. Installs libucx-dev,
## ucx-utils (ucx_perftest) and iperf3 with apt-get when missing; KV_BENCH_FLAGS adds flags
## (e.g. --ucx-tls 'tcp;sm,self' --size 256MiB). About 3 minutes. UCX_PREFIX=DIR builds against
## the UCX installed there instead (e.g. scripts/build-nixl.sh's prefix: UCX 1.19) and runs its
## ucx_perftest.
.PHONY: bench-kv
bench-kv:
	@need=""; pkg-config --exists ucx 2>/dev/null || need="$$need libucx-dev pkg-config"; \
	command -v ucx_perftest >/dev/null 2>&1 || need="$$need ucx-utils"; \
	command -v iperf3 >/dev/null 2>&1 || need="$$need iperf3"; \
	if [ -n "$$need" ]; then \
		echo "==> bench-kv: installing$$need with apt-get"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$need) >/dev/null \
			|| echo "bench-kv: could not install$$need: the columns that need them say n/a"; \
	fi
	@pkg-config --exists ucx 2>/dev/null || [ -n "$(UCX_PREFIX)" ] || { echo "bench-kv: libucx-dev is missing: the sidecar cannot be built with -tags ucx"; exit 1; }
	@mkdir -p $(BIN)/ucx out
ifeq ($(UCX_PREFIX),)
	$(GO) build -tags ucx -o $(BIN)/ucx/ ./cmd/pd-sidecar ./cmd/engine-sim ./cmd/pd-bench
	$(BIN)/ucx/pd-bench kv --bin $(BIN)/ucx --dir out/bench-kv $(KV_BENCH_FLAGS) | tee out/bench-kv.txt
else
	PKG_CONFIG_PATH=$(UCX_PREFIX)/lib/pkgconfig CGO_LDFLAGS="-Wl,-rpath,$(UCX_PREFIX)/lib" \
		$(GO) build -tags ucx -o $(BIN)/ucx/ ./cmd/pd-sidecar ./cmd/engine-sim ./cmd/pd-bench
	$(BIN)/ucx/pd-bench kv --bin $(BIN)/ucx --dir out/bench-kv --ucx-perftest $(UCX_PREFIX)/bin/ucx_perftest $(KV_BENCH_FLAGS) | tee out/bench-kv-prefix.txt
endif

## test-nixl: the nixl kvtransfer transport against the real NIXL library, on host memory over
## NIXL's UCX backend: the binding's round trip, the transport conformance suite and the
## sidecar-pull e2e over nixl (tests named RealNIXL and TestKVPullNIXL). NIXL_PREFIX is an install
## of scripts/build-nixl.sh (UCX, NIXL and libnixl_capi.so built from source), e.g.
##   scripts/build-nixl.sh --download --prefix=$HOME/.cache/pd-sidecar/nixl-0.7.1
##   make test-nixl NIXL_PREFIX=$HOME/.cache/pd-sidecar/nixl-0.7.1
## UCX_PREFIX when UCX went elsewhere (--ucx-prefix). Without NIXL_PREFIX, or without
## lib/libnixl_capi.so in it, prints SKIPPED and succeeds. Not part of make test: CI cannot fetch
## NIXL's and UCX's sources, so CI runs the same suite over a fake library (TestConformanceFakeNIXL).
NIXL_PREFIX ?=
UCX_PREFIX  ?= $(NIXL_PREFIX)
.PHONY: test-nixl
test-nixl:
	@lib="$(NIXL_PREFIX)/lib/libnixl_capi.so"; \
	if [ -z "$(NIXL_PREFIX)" ] || [ ! -f "$$lib" ]; then \
		echo "SKIPPED: test-nixl: no real NIXL library$(if $(NIXL_PREFIX), in $(NIXL_PREFIX)/lib,): build one with scripts/build-nixl.sh --prefix=DIR and run make test-nixl NIXL_PREFIX=DIR"; \
		exit 0; \
	fi; \
	set -e; \
	export NIXL_CAPI_LIB="$$lib" NIXL_PLUGIN_DIR="$(NIXL_PREFIX)/lib/plugins" \
		LD_LIBRARY_PATH="$(NIXL_PREFIX)/lib:$(UCX_PREFIX)/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"; \
	echo "==> test-nixl: $$lib (NIXL_PLUGIN_DIR=$$NIXL_PLUGIN_DIR)"; \
	$(GO) test -race -count=1 -timeout 10m -v -run 'RealNIXL' ./kvtransfer/nixl/; \
	$(GO) test -race -count=1 -timeout 10m -v -run '^TestKVPullNIXL$$' ./e2e/

## lint: gofmt, go vet and staticcheck
lint: vet $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(STATICCHECK) ./...

vet:
	$(GO) vet ./...

$(STATICCHECK):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## render: print the pd-sidecar chart rendered with VALUES (space-separated values files), as
## `helm template` would, without helm: e.g. make render VALUES=my-values.yaml
VALUES ?=
.PHONY: render
render:
	@$(GO) run ./deploy/render -chart deploy/helm/pd-sidecar $(foreach f,$(VALUES),-f $(f))

## schema: regenerate the chart's values.schema.json from values.yaml and pd-sidecar --help
## (a test fails while the committed one is out of date)
.PHONY: schema
schema: build
	$(BIN)/pd-sidecar --help | $(GO) run ./deploy/schemagen > deploy/helm/pd-sidecar/values.schema.json

## docs: regenerate docs/flags.md from pd-sidecar --help (a test fails while it is out of date)
.PHONY: docs
docs:
	UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestFlagsReferenceIsCurrent$$' ./cmd/pd-sidecar/

## demo: engine-sim as a prefill and a decode engine, the sidecar in front, real traffic, a summary
demo: build
	$(BIN)/pd-demo --bin $(BIN)

clean:
	rm -rf $(BIN)

## deploy-check: render the Helm chart (Helm Go SDK, strict k8s.io/api decoding), check the plain
## manifests, the modelservice fragment, the Grafana dashboard's queries against the exported
## metrics, and the Dockerfiles (with hadolint too where it is installed)
.PHONY: deploy-check
deploy-check:
	$(GO) test -count=1 ./deploy/...
	@if command -v hadolint >/dev/null 2>&1; then hadolint Dockerfile Dockerfile.cuda; else echo "hadolint not installed: Dockerfiles checked by deploy/rendertest only"; fi

## modelservice-fixture: render llm-d's modelservice chart from a clone and rewrite
## deploy/rendertest/testdata/llm-d-modelservice.json (the facts the modelservice tests check):
## make modelservice-fixture MODELSERVICE_REPO=../llm-d-modelservice [MODELSERVICE_REF=v0.4.12]
.PHONY: modelservice-fixture
modelservice-fixture:
	@test -n "$(MODELSERVICE_REPO)" || { echo "set MODELSERVICE_REPO to a clone of github.com/llm-d-incubation/llm-d-modelservice"; exit 2; }
	MODELSERVICE_REPO=$(abspath $(MODELSERVICE_REPO)) MODELSERVICE_REF=$(MODELSERVICE_REF) \
		$(GO) test -count=1 -run '^TestModelserviceFixtureRefresh$$' ./deploy/rendertest/

## bench: the performance budget, side by side in one run: engine direct, the sidecar's local and
## disaggregated paths, the P/D floor, nginx (installed from Debian's packages when missing), the
## previous build of pd-sidecar (BENCH_PREVIOUS, a git revision, default HEAD~1, built into
## out/previous/pd-sidecar and run with the sidecar's flags; BENCH_PREVIOUS= skips it, and so does a
## revision that cannot be built, loudly) and PEER_SIDECAR=/path/to/binary when given, with 128-word
## prompts (saturation, open loop, 2,000 slow streams opened at once, 2,000 open streams) and then
## long ones (1k, 8k, 30k, 100k words at 25 req/s; BENCH_FLAGS=--scenarios=long runs those alone);
## then the hot-path micro-benchmarks.
## Writes out/bench.png and out/bench.json.
BENCH_PREVIOUS ?= HEAD~1
PREVIOUS_DIR   := out/previous
.PHONY: bench
bench: build bench-previous
	@command -v nginx >/dev/null 2>&1 || { echo "installing nginx from Debian's packages"; \
		(apt-get update -qq && apt-get install -y -qq nginx) >/dev/null || echo "nginx could not be installed: skipped"; }
	@mkdir -p out
	$(BIN)/pd-bench suite --bin $(BIN) --dir out/bench --plot out/bench.png --json out/bench.json \
		$$([ -x $(PREVIOUS_DIR)/pd-sidecar ] && echo --previous $(CURDIR)/$(PREVIOUS_DIR)/pd-sidecar) $(BENCH_FLAGS)
	$(GO) test -run '^$$' -bench . -benchmem ./connectors/nixlv2 ./proxy/core ./proxy/lane

## bench-previous: build pd-sidecar as of BENCH_PREVIOUS (a git revision, default HEAD~1) into
## out/previous/pd-sidecar, from `git archive` of that revision, for make bench to run beside the
## sidecar; BENCH_PREVIOUS= (empty) builds none. A revision that cannot be built is skipped, loudly.
.PHONY: bench-previous
bench-previous:
	@rm -rf $(PREVIOUS_DIR); \
	if [ -z "$(BENCH_PREVIOUS)" ]; then echo "==> bench: BENCH_PREVIOUS is empty: no previous build"; exit 0; fi; \
	mkdir -p $(PREVIOUS_DIR)/src; \
	rev=$$(git rev-parse --short --verify -q "$(BENCH_PREVIOUS)^{commit}") \
		&& echo "==> bench: building pd-sidecar as of $(BENCH_PREVIOUS) ($$rev) into $(PREVIOUS_DIR)/pd-sidecar" \
		&& git archive "$$rev" | tar -x -C $(PREVIOUS_DIR)/src \
		&& (cd $(PREVIOUS_DIR)/src && $(GO) build -buildvcs=false -o $(CURDIR)/$(PREVIOUS_DIR)/pd-sidecar ./cmd/pd-sidecar) \
		|| { rm -f $(PREVIOUS_DIR)/pd-sidecar; \
			printf '\n********\n*** previous build (%s) could not be built: skipped\n********\n\n' "$(BENCH_PREVIOUS)" >&2; }; \
	rm -rf $(PREVIOUS_DIR)/src

## bench-tail: the tail-latency features against baselines of the same run (pd-bench tail), on
## loopback with engine-sim at a mid-size model's timing and one prefill slot per engine: one
## prefiller of four slow (local only, healthy P/D, P/D with it, the same hedged), a cold prefiller
## with and without --prefill-prewarm, short prompts under --min-remote-prefill-tokens, a prefiller
## killed for 3 s under 200 req/s with and without circuit probing, 10 % of clients leaving right
## after the prefill with and without --release-kv-on-cancel; then a budget table with a verdict per
## line. About 3.5 minutes; TAIL_BENCH_FLAGS adds flags (e.g. --scenarios 1 --duration 30s).
## Writes out/bench-tail.txt, logs in out/bench-tail/. Not part of make test.
.PHONY: bench-tail
bench-tail: build
	@mkdir -p out
	$(BIN)/pd-bench tail --bin $(BIN) --dir out/bench-tail $(TAIL_BENCH_FLAGS) | tee out/bench-tail.txt

## bench-multiturn: multi-turn KV reuse (bidirectional KV transfer) against a baseline of the same run
## (pd-bench multiturn), on loopback with engine-sim at 200 µs a prefilled token and 300 µs a decode
## step: 32 conversations of 6 streamed chat turns in lock-step (30 % of them stop after turn 1), each
## turn carrying the earlier answers back verbatim plus 300-900 new words. Modes: without, with-conversation
## (a session key per conversation), with-pod (every conversation the x-session-token llm-d's endpoint
## picker sets for the decode pod) and with-conversation@15s (a 15 s decoder TTL). Prints per mode and
## turn the new tokens and the tokens the engines computed (engine-sim's ledger, turn by turn), TTFT, the
## decode engine's pinned KV (block·s sampled, read and never read), and the criteria (PASS/FAIL). About
## 90 seconds; MULTITURN_BENCH_FLAGS adds flags (e.g. --modes without,with-none, --abandon 0,
## --decoder-kv-blocks-ttl 60s). Writes out/bench-multiturn.txt, logs in out/bench-multiturn/. Not part of
## make test.
.PHONY: bench-multiturn
bench-multiturn: build
	@mkdir -p out
	$(BIN)/pd-bench multiturn --bin $(BIN) --dir out/bench-multiturn $(MULTITURN_BENCH_FLAGS) | tee out/bench-multiturn.txt

## kube-apiserver: build bin/kube-apiserver from k8s.io/kubernetes (the module in e2e/kube/apiserver) for
## make test-k8s: about 10 minutes and 3 GB of memory on 2 cores the first time. The binary is kept in
## $(KUBE_CACHE) under a hash of that module's go.mod and go.sum and copied from there while they
## are unchanged; a change builds it again.
KUBE_VERSION   := v1.37.2
KUBE_CACHE     ?= $(HOME)/.cache/pd-sidecar
KUBE_APISERVER := $(BIN)/kube-apiserver
.PHONY: kube-apiserver
kube-apiserver:
	@mkdir -p $(BIN) $(KUBE_CACHE); \
	key=$$(cat e2e/kube/apiserver/go.mod e2e/kube/apiserver/go.sum | sha256sum | cut -c1-16); \
	cached="$(KUBE_CACHE)/kube-apiserver-$(KUBE_VERSION)-$$key"; \
	if [ -x $(KUBE_APISERVER) ] && [ "$$(cat $(BIN)/.kube-apiserver-key 2>/dev/null)" = "$$key" ]; then exit 0; fi; \
	if [ ! -x "$$cached" ]; then \
		echo "==> kube-apiserver $(KUBE_VERSION): building from k8s.io/kubernetes (about 10 minutes on 2 cores; once per go.mod)"; \
		start=$$(date +%s); \
		(cd e2e/kube/apiserver && $(GO) build -trimpath \
			-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" \
			-o "$$cached.tmp" k8s.io/kubernetes/cmd/kube-apiserver) && mv "$$cached.tmp" "$$cached" || exit 1; \
		echo "==> kube-apiserver built in $$(( $$(date +%s) - start )) s, kept in $$cached"; \
	fi; \
	cp -f "$$cached" $(KUBE_APISERVER) && echo "$$key" > $(BIN)/.kube-apiserver-key

## test-k8s: the e2e tests against a real Kubernetes API server (etcd from Debian's etcd-server, installed
## here with apt-get when missing and this user may; kube-apiserver from make kube-apiserver): the
## SSRF allowlist's InferencePool watch, the chart installed with the Helm SDK and run as its
## ServiceAccount, the watch's cost (about 3 minutes). Fails, never skips, when either cannot be had.
.PHONY: test-k8s
test-k8s: kube-apiserver
	@if ! command -v etcd >/dev/null 2>&1; then \
		sudo=""; [ "$$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; } || true; \
		echo "==> test-k8s: installing etcd-server with apt-get"; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends etcd-server >/dev/null || true; \
	fi; \
	command -v etcd >/dev/null 2>&1 || { echo "test-k8s: etcd is not installed and could not be: sudo apt-get install etcd-server"; exit 1; }
	$(GO) test -race -count=1 -tags k8s -run 'K8s' -timeout 20m ./e2e/

## k8s-watch-cost: what the sidecars' InferencePool watches cost the real API server and a new prefill
## pod, without the race detector: 1, 10 and 50 sidecars (K8S_WATCH_SIDECARS) in a namespace of 1,000 other
## pods (K8S_OTHER_PODS), 50 started at once with and without the streaming initial list
## (K8S_FLEET_SIDECARS), 50 warming a new prefill pod with and without the spread (K8S_PREWARM_SIDECARS):
## the tables of docs/deploy.md (about 10 minutes).
.PHONY: k8s-watch-cost
k8s-watch-cost: kube-apiserver
	K8S_WATCH_SIDECARS=$${K8S_WATCH_SIDECARS:-1,10,50} K8S_OTHER_PODS=$${K8S_OTHER_PODS:-1000} \
	K8S_FLEET_SIDECARS=$${K8S_FLEET_SIDECARS:-50} K8S_PREWARM_SIDECARS=$${K8S_PREWARM_SIDECARS:-50} \
		$(GO) test -count=1 -v -tags k8s -run 'TestK8sWatchCost|TestK8sFleetStartup|TestK8sPrewarmSpread' -timeout 40m ./e2e/

## test-wire-shapes: the P/D e2e scenarios once more with every engine-sim speaking the oldest
## NIXL wire shape still supported (vLLM's single-file connector of ~0.9: flat block ids, no
## remote_request_id, no tp_size), as go test ./... runs them on the newest (engine-sim's
## default); every shape also splits in TestCorpusShapesSplit. About 2 minutes on 2 cores.
OLDEST_WIRE_SHAPE := vllm-nixl-single-file-v1
WIRE_SHAPE_TESTS  := TestSidecar(NoHeader|Disaggregated|PrefillerFailures|PrefillerDown|PrefillRetries|Prefiller400|KVLoadFailure|EOSOnFirstToken|FallbackDisabled)|TestLaneSplitAnswersAsTheServer|TestReleaseKVOnCancel|TestHedgedPrefill$$|TestConnectorsSplitEveryAPI
.PHONY: test-wire-shapes
test-wire-shapes:
	@echo "==> test-wire-shapes: the P/D e2e scenarios on $(OLDEST_WIRE_SHAPE)"
	PD_E2E_WIRE_SHAPE=$(OLDEST_WIRE_SHAPE) $(GO) test -count=1 -timeout 15m -run '$(WIRE_SHAPE_TESTS)' ./e2e/

## fuzz-short: a short seeded run of every fuzz target (connector body rewriting (its member walk against gjson's), upstream answers' handoffs through every connector, client connector field stripping, JSON body validation and its top-level read, the one-parse differential (the sidecar's reading against a last-member and a case-insensitive decoder), header parser, SSE event split (goroutine and event-loop), scanner and rewriter, chunked body decoder, the lane's request heads, upstream answers on both paths)
# An execution count, not a duration: a duration races Go's fuzzing coordinator at its end
# (golang/go#75804: "context deadline exceeded" with no input found, on a loaded machine).
FUZZTIME ?= 20000x
.PHONY: fuzz-short
fuzz-short:
	@set -e; for t in FuzzConnectorLegs FuzzEditObject FuzzClassifyEvent FuzzStripClientFields FuzzValidObject FuzzScanBody FuzzOneParse FuzzEditObjectScan FuzzPrefillAnswerHandoff; do \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./connectors/; done
	@set -e; for t in FuzzPickPrefiller FuzzSSEErrorEvent FuzzUpstreamAnswer; do \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./proxy/core/; done
	$(GO) test -run '^$$' -fuzz '^FuzzLaneRequestHead$$' -fuzztime $(FUZZTIME) ./proxy/lane/
	@set -e; for t in FuzzSSEScanRewrite FuzzEventReaderSplits; do \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./proxy/sse/; done
	@set -e; for t in FuzzLoopStreamSplits FuzzHandOverAnywhere; do \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./proxy/sserelay/; done
	$(GO) test -run '^$$' -fuzz '^FuzzDecoderChunked$$' -fuzztime $(FUZZTIME) ./httpbody/
