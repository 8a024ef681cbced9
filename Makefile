# make demo: set up, then run the worker on the embedded default (file source and sink).
# make test: set up, start the local Kafka broker, run every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SW := $(VENV)/bin/scoring-worker
BROKER := deploy/kafka-local/broker

.PHONY: setup build demo demo-data test image test-fast lint bench bench-lazy bench-e2e bench-explain fidelity mutate \
	bench-categorical bench-tls bench-serve bench-serve-fairness bench-runtimes golden clean chaos-abort \
	chaos-network docs \
	broker-start \
	broker-stop fuzz soak chaos

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel "Cython>=3.0" "numpy>=1.26" \
		"pysimdjson>=7,<8"
	$(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $@ $(VENV)/.built  # that install built the extensions: no second build

# Rebuild the Cython extensions when a source changes (pip's editable build is the only builder).
build: setup $(VENV)/.built
$(VENV)/.built: $(wildcard cyext/*.pyx cyext/*.pxd cyext/*.h cyext/worker/*.pxd) setup.py \
		$(VENV)/.installed
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

demo-data: build
	$(PY) -m worker.demo prepare

demo: demo-data
	$(SW) --config config/demo.yaml

test: build
	tests/run.sh $(PY)

# The edit loop: every test that needs no broker and no cluster (CI runs everything, make test)
# The container image (deploy/Dockerfile) built with Podman on a Debian base made with
# debootstrap (deploy/image/build: no registry needed; Debian's podman, debootstrap and runc
# installed where apt and root allow), then the demo and serve run inside it non-root on a
# read-only root (tests/test_image.py). .ci/run runs it after make test: ~4 minutes from a fresh
# machine, ~2 with the base cached.
image: demo-data
	SW_NO_SKIPS=1 $(PY) -m pytest -q -p no:cacheprovider -m image -rs tests/test_image.py

test-fast: build
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -p no:cacheprovider -n 2 -m "not kafka and not cluster and not alone and not image" \
		--durations=15

# The chaos suite's long forms (~60 minutes; make test runs the short ones): pauses past the
# session timeout (50 a delivery mode) and max.poll.interval.ms, at random moments and at
# chosen points, workers joining and leaving, partitions added, a fenced zombie, broker
# restarts, a model swap during a rebalance; writes bench/CHAOS-RESULTS.md. CHAOS_SEED replays.
# Then chaos-abort (~12 minutes) and chaos-network (~45 minutes), below.
CHAOS_SEED ?= $(shell date +%s)
chaos: build
	$(PY) bench/chaos.py --seed $(CHAOS_SEED) $(foreach s,$(CHAOS_LOCAL),--scenario $(s))
	$(MAKE) chaos-abort
	$(MAKE) chaos-network

CHAOS_LOCAL = pause pause-points poll-interval pause-two join-leave add-partitions zombie \
	broker-restart swap-rebalance
CHAOS_NETWORK = net-latency net-bandwidth net-blackhole net-reset-peer net-slicer net-limit-data \
	net-broker-down net-flapping

# Network faults (issue 53): ten of each Toxiproxy fault type in each delivery mode between a
# worker and the three-node cluster (~45 minutes; make test runs one of each a mode); writes
# bench/NETWORK-RESULTS.md. Toxiproxy is built with Go on first use (tests/toxiproxy.py).
chaos-network: build
	$(PY) bench/chaos.py --seed $(CHAOS_SEED) $(foreach s,$(CHAOS_NETWORK),--scenario $(s)) \
	  --out bench/NETWORK-RESULTS.md

# 20 workers started while their group's coordinator is frozen 15-25 s (issue 53: librdkafka's
# abort in the start-up access check): each starts or exits 1 (~12 minutes; make test runs 2)
chaos-abort: build
	SW_ABORT_TRIALS=20 tests/run.sh $(PY) tests/test_cluster.py -k coordinator_is_frozen

# 100,000 hostile Arrow, JSON and Avro messages and artifacts each, through the worker in child processes
# (make test runs a bounded 3,000 + 2,000); crashes and hangs are kept under out/fuzz.
FUZZ_CASES ?= 100000
FUZZ_SEED ?= $(shell date +%s)
fuzz: build
	$(PY) -m tests.fuzz messages json avro requests artifacts --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) \
		--state out/fuzz

lint: setup
	$(VENV)/bin/ruff check .

# The documentation site (README.md is the landing page, docs/ the pages, mkdocs.yml the nav):
# MkDocs with the Material theme (the `test` extra), strict: a broken link or anchor fails it.
# tests/test_docs.py builds it too. After a change to worker/config.py:
# python -m worker.configdoc --update (docs/configuration.md's reference).
docs: setup
	$(PY) -m mkdocs build --strict -d out/site

# Kernels against XGBoost, scikit-learn and TL2cgen (versions pinned in the `bench` extra).
bench: build
	$(PY) -m pip install -q "treelite==4.6.1" "tl2cgen==1.0.0" "xgboost==3.2.0" "scikit-learn==1.9.1" \
		"lightgbm==4.7.0"
	$(PY) bench/run.py
	$(PY) bench/explain.py
	$(PY) bench/categorical.py
	$(PY) bench/onnx_speed.py
	$(PY) bench/catboost_speed.py

# ours against ONNX Runtime on exported models and against CatBoost's predictor
# (bench/ONNX-RESULTS.md, bench/CATBOOST-RESULTS.md; in make bench), the oblivious and leaf-mask
# kernels against the kernels they replace (printed)
bench-runtimes: build
	$(PY) bench/onnx_speed.py
	$(PY) bench/catboost_speed.py
	$(PY) bench/oblivious_micro.py
	$(PY) bench/masks_micro.py

# models E (LightGBM, categorical features) and F (XGBoost partition splits) against LightGBM,
# lleaves and XGBoost (bench/CATEGORICAL-RESULTS.md)
bench-categorical: build
	$(PY) -m pip install -q "lightgbm==4.7.0"
	$(PY) bench/categorical.py

# attributions against XGBoost and shap, and the cost of reason codes (bench/EXPLAIN-RESULTS.md)
bench-explain: build
	$(PY) bench/explain.py

bench-lazy: build
	$(PY) bench/lazy.py

# End to end: file -> file and through the local broker, against a bare pyarrow loop and the
# hand-written XGBoost loop; writes bench/E2E-RESULTS.md and two PNGs (~15 minutes).
bench-e2e: build
	$(PY) -m pip install -q "xgboost==3.2.0" matplotlib
	$(PY) bench/e2e.py
	$(PY) bench/monitoring_cost.py

# `scoring-worker serve` against MLServer at its default and fastest settings (its own
# virtualenv, bench/out/mlserver-venv) and against serve before issue 50 (a worktree built
# there): wrk (Debian's package) on one core, each server on the other; writes
# bench/SERVE-RESULTS.md and bench/serve-latency.png (~10 minutes the first time).
bench-serve: build
	$(PY) -m pip install -q "xgboost==3.2.0" matplotlib
	command -v ghz >/dev/null || test -x "$$(go env GOPATH)/bin/ghz" || \
		go install github.com/bojand/ghz/cmd/ghz@v0.93.0
	$(PY) bench/serve.py

# A good client's latency while each attack of issue 50 runs, serve now and before issue 50 (a
# worktree built there); writes bench/SERVE-FAIRNESS.md (~5 minutes, 4 more the first time).
bench-serve-fairness: build
	$(PY) -m pip install -q "xgboost==3.2.0"
	$(PY) bench/serve_fairness.py

# What TLS and SASL cost: exactly-once one-row throughput on the plaintext broker against the
# SASL_SSL one (started here), alternating; writes bench/SECURITY-RESULTS.md (~5 minutes).
bench-tls: build
	$(PY) bench/tls_cost.py

# Soak (not in CI, ~12 minutes): 1,000,000 records through two exactly-once workers on the
# three-node cluster while workers are SIGKILLed 20 times and brokers 3 times; writes
# bench/SOAK-RESULTS.md and bench/soak.png, exit 0 only if nothing is lost or duplicated.
soak: build
	$(PY) -m pip install -q matplotlib
	$(PY) bench/soak.py

# Regenerate tests/golden/* (review the diff before committing; tests never regenerate it).
golden: build
	$(PY) -m tests.golden

broker-start:
	$(BROKER) start

broker-stop:
	$(BROKER) stop

clean:
	rm -rf build $(VENV) cyext/*.c worker/*.so *.egg-info

# the differential matrix (issue 49): every library's models in many configurations against
# the library's own predict on hostile rows -> bench/FIDELITY.md (make test runs --quick)
fidelity: build
	$(PY) bench/fidelity.py

# mutation testing on the modules that carry guarantees (issue 55): a seeded random 40
# mutants a module by default (about two hours for all of them; MUTATE_ARGS= for every
# mutant: days); make mutate MODULE=worker/formats/json.py in the edit loop (resumes a run
# stopped part way), MUTATE_ARGS=--rerun-survivors once tests are written for them
# (mutation/RESULTS.md)
MUTATE_ARGS ?= --sample 40
mutate: build
	$(PY) -m pip install -q "cosmic-ray==8.7.0"
	$(PY) mutation/run.py $(MODULE) $(MUTATE_ARGS)
