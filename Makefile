# shardlab: the two commands a newcomer needs are `make lab` and `make test`.
GO ?= go

.PHONY: lab quick test lint build clean

## lab: run every scenario on SQLite (single vs sharded, 6 interleaved trials, 16 to 21 minutes
## on 2 cores) into its own directory results/runs/<run-id>/ (results/latest points at it)
lab:
	./scripts/run_all_scenarios.sh

## quick: a smoke test in under a minute (1 trial, a tenth of the requests): it concludes nothing
quick:
	./scripts/run_all_scenarios.sh --quick

## test: formatting, vet, staticcheck and every test with the race detector.
## PostgreSQL tests run when SHARDLAB_PG_DSN is set (CI sets it; see .ci/run); without it
## they skip, and the summary at the end says how many and how to run them.
test: lint
	$(GO) run ./internal/cmd/gotest -race -count=1 -timeout 30m ./...

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

build:
	mkdir -p bin
	$(GO) build -o bin/ ./cmd/...

clean:
	rm -rf bin
