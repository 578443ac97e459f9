# effectd: `make run` starts the daemon, `make test` checks and tests everything,
# `make test-fast` runs the quick tests; `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --quiet --disable-pip-version-check
DATA_DIR ?= .effectd
ARGS ?=
PYTEST_ARGS ?=

INSTALLED := $(VENV)/.installed
DEV_INSTALLED := $(VENV)/.dev-installed
NODE_INSTALLED := clients/node/node_modules/.installed
# The frameworks whose pins cannot live beside the daemon's and the dev
# tools' (ADK requires opentelemetry-api<=1.44 and mcp<2; CrewAI 1.6.1 pins
# openai below the dev tools' and brings its own vector store): each in a
# virtual environment of its own, with the client installed editable and its extra; the tests run their
# agents there as child processes (tests/adapters/isolated).
ADK_VENV ?= .venv-adk
ADK_INSTALLED := $(ADK_VENV)/.installed
CREWAI_VENV ?= .venv-crewai
CREWAI_INSTALLED := $(CREWAI_VENV)/.installed

# The synchronous Python client is build output, not kept in git: written from
# its asyncio source by clients/python/unasync.py (with ruff, a dev tool here),
# by the client's own build too (clients/python/setup.py), so `make run` needs
# no rule of this.
CLIENT_SRC := clients/python/src/effectd_client
SYNC_CLIENT := $(CLIENT_SRC)/_client.py $(CLIENT_SRC)/_safe.py $(CLIENT_SRC)/_operator.py
ASYNC_CLIENT := $(CLIENT_SRC)/_aio.py $(CLIENT_SRC)/_safe_aio.py $(CLIENT_SRC)/_operator_aio.py

.PHONY: help run test test-fast check unasync frameworks chromium pgbouncer node-test protos dist bench bench-node bench-peers bench-scale bench-shared image-test clean torture-deep many-daemons-deep

$(PY):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): $(PY) pyproject.toml clients/python/pyproject.toml
	$(PIP) install -e clients/python -e .
	touch $@

# The client's extras are tested too: `mcp` (effectd_client.contrib.mcp) with its
# pinned SDK and its real servers, `pydantic-ai` (effectd_client.contrib.pydantic_ai),
# `langgraph` (effectd_client.contrib.langgraph) with real graphs and checkpointers,
# `openai-agents` (effectd_client.contrib.openai_agents), `agent-framework`
# (effectd_client.contrib.agent_framework).
$(DEV_INSTALLED): $(INSTALLED) requirements-dev.txt clients/python/pyproject.toml
	$(PIP) install -r requirements-dev.txt -e 'clients/python[mcp,pydantic-ai,langgraph,openai-agents,agent-framework]'
	touch $@

## run: start the daemon on its embedded default (LMDB in ./.effectd, Unix socket there;
## --init: the first run creates the ledger, later runs open it)
run: $(INSTALLED)
	$(VENV)/bin/effectd serve --data-dir $(DATA_DIR) --init $(ARGS)

## check: lint, format, strict typing, the protos' generated code fresh (the
## synchronous client is written first, from the asyncio one)
check: $(DEV_INSTALLED) $(SYNC_CLIENT)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) scripts/gen_protos.py --check

## unasync: write the synchronous client's modules from the asyncio ones
## (clients/python/unasync.py: _aio.py -> _client.py, _safe_aio.py -> _safe.py,
## _operator_aio.py -> _operator.py); check, test and test-fast do it when a
## source changed
unasync: $(SYNC_CLIENT)

$(SYNC_CLIENT) &: $(ASYNC_CLIENT) clients/python/unasync.py | $(DEV_INSTALLED)
	$(PY) clients/python/unasync.py
	touch $(SYNC_CLIENT)

## test: install what the tests need, run the checks and the whole suite: on
## TEST_WORKERS workers, then the tests marked serial (many processes racing,
## deadlines under load) alone, one coverage report for both. Three workers on
## two cores: most of the suite waits on daemons and processes of its own
## (16 min of CPU in 12.6 min on two workers), so a third overlaps the waits
TEST_WORKERS ?= 3
test: check chromium pgbouncer $(NODE_INSTALLED) $(ADK_INSTALLED) $(CREWAI_INSTALLED)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not serial" \
	  --cov --cov-report= --cov-fail-under=0 $(PYTEST_ARGS)
	$(PY) -m pytest -m serial --cov --cov-append --cov-report=term $(PYTEST_ARGS)
	$(MAKE) node-test

## frameworks: the virtual environments of the frameworks that cannot share
## .venv (.venv-adk: Google ADK; .venv-crewai: CrewAI), the client installed
## editable with its extra
frameworks: $(ADK_INSTALLED) $(CREWAI_INSTALLED)

$(ADK_INSTALLED): clients/python/pyproject.toml
	$(PYTHON) -m venv $(ADK_VENV)
	$(ADK_VENV)/bin/python -m pip --quiet --disable-pip-version-check install -e 'clients/python[google-adk]'
	touch $@

$(CREWAI_INSTALLED): clients/python/pyproject.toml
	$(PYTHON) -m venv $(CREWAI_VENV)
	$(CREWAI_VENV)/bin/python -m pip --quiet --disable-pip-version-check install -e 'clients/python[crewai]'
	touch $@

## chromium: Debian's chromium, the browser the console's tests (tests/web)
## drive with Playwright; Playwright's own browser download is never used
chromium:
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium)

## pgbouncer: Debian's PgBouncer, which the tests of the PostgreSQL store through a
## pooler (tests/support/pgbouncer.py) start in transaction mode
pgbouncer:
	test -x /usr/sbin/pgbouncer || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pgbouncer)

# The Node client's packages: its tests and the documents' JavaScript blocks
# (tests/repository/test_docs.py) run on them.
$(NODE_INSTALLED): clients/node/package.json clients/node/package-lock.json
	cd clients/node && npm ci --no-audit --no-fund
	touch $@

## test-fast: the inner loop: every test not marked slow; no checks, no coverage;
## about 90 s on a quiet 2-core machine. What is slow (marked in its module, or named
## in tests/support/slow.py) runs in `make test`; each property (durability, at most
## one attempt, isolation, no replay) keeps a test and its negative control here:
## tests/README.md lists them
test-fast: $(DEV_INSTALLED) $(SYNC_CLIENT) pgbouncer
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow" -q $(PYTEST_ARGS)

## node-test: the Node client's tests against a real daemon (needs node and npm), three
## times: the ledger session on the daemon's framed socket (the default), on the gRPC
## session stream (EFFECTD_TRANSPORT=grpc), then unary (EFFECTD_SESSION=0)
node-test: $(INSTALLED) $(NODE_INSTALLED)
	cd clients/node && EFFECTD_PYTHON=$(abspath $(PY)) EFFECTD_SESSION=1 EFFECTD_TRANSPORT= npm test \
	  && EFFECTD_PYTHON=$(abspath $(PY)) EFFECTD_SESSION=1 EFFECTD_TRANSPORT=grpc npm test \
	  && EFFECTD_PYTHON=$(abspath $(PY)) EFFECTD_SESSION=0 EFFECTD_TRANSPORT= npm test

## torture-deep: the model-based torture test (tests/torture) in its deep setting:
## TORTURE_EXAMPLES random operation sequences of TORTURE_STEPS steps on LMDB
## (TORTURE_PG_EXAMPLES on PostgreSQL), and a random
## search for each planted bug of its negative controls; the answers reached go to
## TORTURE_REPORT (`make test` runs the fast setting); the failpoint table's
## cases each FAILPOINT_REPEAT times, every point on both stores; the crash
## loops (tests/torture/test_crash_loops.py): TORTURE_CRASH_CYCLES kill cycles
## on LMDB, TORTURE_CRASH_PG_CYCLES on PostgreSQL (one in eight restarts its
## database, some with an outage of seconds), figures beside TORTURE_REPORT;
## TORTURE_LIN_HISTORIES linearizability histories per store of
## TORTURE_LIN_SECONDS seconds each, with TORTURE_LIN_CLIENTS clients on calls and
## as many on checkpoints, under pauses and kills, figures beside TORTURE_REPORT.
## The fuzz test sends TORTURE_FUZZ_EXECS requests on LMDB and TORTURE_FUZZ_PG_EXECS
## on PostgreSQL, TORTURE_FUZZ_MUTANTS mutants of each drawn one (its figures beside
## TORTURE_REPORT, NAME-fuzz-lmdb.json and NAME-fuzz-postgres.json).
TORTURE_EXAMPLES ?= 2000
TORTURE_PG_EXAMPLES ?= 300
TORTURE_STEPS ?= 60
FAILPOINT_REPEAT ?= 5
TORTURE_CRASH_CYCLES ?= 2000
TORTURE_CRASH_PG_CYCLES ?= 500
TORTURE_LIN_HISTORIES ?= 20
TORTURE_LIN_SECONDS ?= 30
TORTURE_LIN_CLIENTS ?= 5
TORTURE_REPORT ?= torture-report.json
TORTURE_FUZZ_EXECS ?= 100000
TORTURE_FUZZ_PG_EXECS ?= $(TORTURE_FUZZ_EXECS)
TORTURE_FUZZ_MUTANTS ?= 9
torture-deep: $(DEV_INSTALLED)
	TORTURE_EXAMPLES=$(TORTURE_EXAMPLES) TORTURE_PG_EXAMPLES=$(TORTURE_PG_EXAMPLES) \
	  TORTURE_STEPS=$(TORTURE_STEPS) FAILPOINT_REPEAT=$(FAILPOINT_REPEAT) \
	  TORTURE_CRASH_CYCLES=$(TORTURE_CRASH_CYCLES) \
	  TORTURE_CRASH_PG_CYCLES=$(TORTURE_CRASH_PG_CYCLES) \
	  TORTURE_LIN_HISTORIES=$(TORTURE_LIN_HISTORIES) TORTURE_LIN_SECONDS=$(TORTURE_LIN_SECONDS) \
	  TORTURE_LIN_CLIENTS=$(TORTURE_LIN_CLIENTS) \
	  TORTURE_FUZZ_EXECS=$(TORTURE_FUZZ_EXECS) TORTURE_FUZZ_PG_EXECS=$(TORTURE_FUZZ_PG_EXECS) \
	  TORTURE_FUZZ_MUTANTS=$(TORTURE_FUZZ_MUTANTS) \
	  TORTURE_REPORT=$(abspath $(TORTURE_REPORT)) TORTURE_CONTROL_SEARCH=1 \
	  $(PY) -m pytest tests/torture -q -s -p no:cacheprovider $(PYTEST_ARGS)

## many-daemons-deep: the races of several daemons on one PostgreSQL store, longer than
## `make test` runs them: RACE_ROUNDS rounds of 32 client processes on three daemons
## (prepare-and-start, and StartTool),
## OPERATOR_ROUNDS of two operators and two approvers at two daemons, QUOTA_ROUNDS of
## callers at three daemons against an open-call quota
RACE_ROUNDS ?= 1000
OPERATOR_ROUNDS ?= 200
QUOTA_ROUNDS ?= 40
many-daemons-deep: $(DEV_INSTALLED)
	EFFECTD_RACE_ROUNDS=$(RACE_ROUNDS) EFFECTD_RACE_MODES=prepare,start \
	  EFFECTD_OPERATOR_ROUNDS=$(OPERATOR_ROUNDS) \
	  EFFECTD_QUOTA_ROUNDS=$(QUOTA_ROUNDS) \
	  $(PY) -m pytest tests/system/test_many_daemons_race.py tests/system/test_many_daemons_operators.py \
	  tests/system/test_many_daemons_quota.py -q -p no:cacheprovider $(PYTEST_ARGS)

## bench-node: the Node client's round trips, session stream against unary (ratios in one run)
bench-node: $(INSTALLED)
	cd clients/node && npm ci --no-audit --no-fund && EFFECTD_PYTHON=$(abspath $(PY)) node bench/session.mjs

## dist: the packages, built from this checkout into DIST (none is published):
## the daemon's and the Python client's wheels and sdists (`python -m build`,
## with the pinned setuptools of the venv), and the Node client's npm tarball,
## the protos inside it
DIST ?= dist
dist: $(DEV_INSTALLED)
	rm -rf $(DIST) && mkdir -p $(DIST)/node-package/protos
	$(PY) -m build --no-isolation --outdir $(DIST) .
	$(PY) -m build --no-isolation --outdir $(DIST) clients/python
	cp -R clients/node/package.json clients/node/README.md clients/node/src $(DIST)/node-package/
	cp -R clients/node/protos/. protos/. $(DIST)/node-package/protos/
	cd $(DIST)/node-package && npm pack --silent --pack-destination $(abspath $(DIST))
	rm -rf $(DIST)/node-package

## protos: regenerate clients/python/src/effectd from protos/
protos: $(DEV_INSTALLED)
	$(PY) scripts/gen_protos.py

## bench: measure against baselines in the same run (prints ratios)
bench: $(DEV_INSTALLED)
	$(PY) bench/lifecycle.py
	$(PY) bench/session.py
	$(PY) bench/serving_model.py
	$(PY) bench/provider_stream.py
	$(PY) bench/client_session.py
	$(PY) bench/local_transport.py

## bench-peers: effectd against Powertools idempotency on durable Redis, ratios in
## one run (installs redis-server and a bench venv outside the repo; PEERS_* knobs)
bench-peers: $(INSTALLED)
	$(PY) bench/peers.py

## bench-scale: one ledger at scale: a store of SCALE_RECORDS records (20,000 by
## default, a quick check; 1000000 for docs/benchmarks.md) against an empty one
SCALE_RECORDS ?= 20000
bench-scale: $(INSTALLED)
	$(PY) bench/scale.py --records $(SCALE_RECORDS) $(ARGS)

## bench-shared: effectd on PostgreSQL against DBOS Transact on the same server
## (DBOS in a venv of its own outside the repository, EFFECTD_BENCH_STATE), 1 and 16
## callers, first executions and duplicates validated per key, and effectd on 1 to 4
## daemons at 32 callers, ratios in one run; then what one call sends the database
## (commits, statements, WAL, CPU), and what a metrics scrape costs a daemon on a
## ledger of 200,000 calls (bench/pg_scrape.py); databases of their own on EFFECTD_BENCH_POSTGRES,
## dropped after; the fast setting by default (2 rounds), SHARED_DEEP=1 the deep one
## (5 rounds of three times the keys); the plot of calls/s against daemons goes
## to SHARED_PLOT (matplotlib of the bench venv)
SHARED_DEEP ?=
SHARED_PLOT ?= docs/shared-scale.png
bench-shared: $(INSTALLED)
	$(PY) bench/versus_dbos.py $(if $(SHARED_DEEP),--deep) --plot $(SHARED_PLOT) $(ARGS)
	$(PY) bench/pg_cost.py
	$(PY) bench/pg_scrape.py

## image-test: build the container image with podman and probe it (opt-in; root,
## installs podman, buildah, debootstrap and runc with apt-get if missing)
image-test: $(INSTALLED)
	PY=$(abspath $(PY)) scripts/image_test.sh

## help: list these targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## clean: remove the virtualenv and the tools' caches
clean:
	rm -rf $(VENV) $(ADK_VENV) $(CREWAI_VENV) .mypy_cache .ruff_cache .pytest_cache .coverage
