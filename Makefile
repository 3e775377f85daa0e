# onceflow — run `make help` for the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
# Every module of the workspace (go.work): the root module and the ones that
# hold only the repository's own tests and tools (docs/architecture.md, "Modules").
PKGS      ?= ./... ./cmd/demo/... ./deploy/k8s/...
TEST_TIMEOUT ?= 14m
# Services are started by scripts/services.sh unless these name existing ones.
SERVICES  := scripts/services.sh
WITH_SERVICES = set -a; eval "$$($(SERVICES) up)"; set +a;
# The tests run the throwaway PostgreSQL with fsync off, the benchmarks with
# it on (scripts/services.sh explains why).
WITH_TEST_SERVICES = set -a; eval "$$(ONCEFLOW_PG_FSYNC=off $(SERVICES) up)"; set +a;
WITH_BENCH_SERVICES = set -a; eval "$$(ONCEFLOW_PG_FSYNC=on $(SERVICES) up)"; set +a;
# Installs the Debian packages a target needs (as root) or names the command
# that does; the groups and packages are listed in the script.
REQUIRE   := scripts/require.sh

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the binaries (relay, consumer, soak, demo) into ./bin.
	$(GO) build -o bin/ ./cmd/... ./cmd/demo

.PHONY: test
test: ## Run all tests (unit, integration, fault) with -race against real PostgreSQL and Kafka, with test-python beside them.
	@$(REQUIRE) postgres kafka test
	@$(WITH_TEST_SERVICES) GO='$(GO)' PKGS='$(PKGS)' TEST_TIMEOUT='$(TEST_TIMEOUT)' scripts/test.sh

.PHONY: test-python
test-python: ## The Python package: its venv (scripts/python-venv.sh), mypy --strict, pytest against real PostgreSQL.
	@$(REQUIRE) postgres python
	@$(WITH_TEST_SERVICES) scripts/test-python.sh

.PHONY: test-short
test-short: ## Run only the unit tests that need no services (the service variables point nowhere, so a test that reaches one fails).
	ONCEFLOW_TEST_DATABASE_URL='postgres://no-service@127.0.0.1:1/none?connect_timeout=1' \
	ONCEFLOW_TEST_KAFKA_BROKERS=127.0.0.1:1 \
	$(GO) test -race -count=1 -short $(PKGS)

.PHONY: lint
lint: ## gofmt check, go vet and staticcheck.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

.PHONY: bench
bench: ## Run the benchmarks against real services; prints figures beside same-run ceilings.
	@$(REQUIRE) postgres kafka
	@$(WITH_BENCH_SERVICES) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./bench/

.PHONY: bench-smoke
bench-smoke: ## Run the benchmark harness with tiny sizes (< 60 s); checks the figures are produced. Part of `make test`.
	@$(REQUIRE) postgres kafka
	@$(WITH_SERVICES) $(GO) test -race -count=1 -run '^TestBenchSmoke$$' -timeout 5m ./bench/

DEMO_ARGS ?=
.PHONY: demo
demo: build ## Run onceflow end to end on embedded defaults, with chaos; KAFKA=local uses the real broker. DEMO_ARGS="-duration 60s -rate 500".
	@$(REQUIRE) postgres $(if $(filter local,$(KAFKA)),kafka,)
	@if [ "$(KAFKA)" = local ]; then set -a; eval "$$($(SERVICES) up kafka)"; set +a; fi; \
	$(GO) run ./cmd/demo -bin-dir bin $(if $(filter local,$(KAFKA)),-kafka local,) $(DEMO_ARGS)

DURATION ?= 10m
SEED ?= 0
SOAK_ARGS ?=
.PHONY: soak
soak: build ## Chaos soak: 3 Kafka brokers, own PostgreSQL, relays/consumers/brokers/database killed; report in soak-results/. DURATION=1h SEED=n SOAK_ARGS="-rate 300".
	@$(REQUIRE) postgres kafka
	$(GO) run ./cmd/soak -bin-dir bin -duration $(DURATION) -seed $(SEED) $(SOAK_ARGS)

IMAGE ?= bin/onceflow-image.oci.tar
.PHONY: image
image: ## Build the container image (both binaries, from scratch, non-root) into $(IMAGE), an OCI archive; no Docker daemon or registry needed.
	@$(REQUIRE) image
	@scripts/image.sh $(IMAGE)

.PHONY: services-up
services-up: ## Start (or reuse) the local PostgreSQL and Kafka; prints their env.
	@$(REQUIRE) postgres kafka
	@$(SERVICES) up

.PHONY: services-down
services-down: ## Stop the local PostgreSQL and Kafka started by services-up.
	@$(SERVICES) down

.PHONY: services-status
services-status: ## Show whether the local services run.
	@$(SERVICES) status

.PHONY: clean
clean: ## Remove build output.
	rm -rf bin/
