// Command gotest runs `go test -json` with the given flags and packages and prints what
// `go test` prints, then how many tests passed, failed and were skipped, and how many
// skipped ones need PostgreSQL, with the command that runs them. `make test` uses it:
//
//	go run ./internal/cmd/gotest -race -count=1 ./...
//
// It exits with go test's status. The flags are go test's; gotest has none of its own
// but -h, which prints this text.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardlab/shardlab/internal/gotest"
)

const usage = `usage: go run ./internal/cmd/gotest [go test flags] [packages]

Runs go test -json with the arguments, prints what go test prints, then a summary:
tests passed, failed and skipped, and the skipped tests that need PostgreSQL
(SHARDLAB_PG_DSN unset) with the command that runs them. Exits with go test's status.
`

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "-help") {
		fmt.Print(usage)
		return
	}
	// go test gets the signal too (same process group) and stops; gotest then reports.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := gotest.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gotest: %v\n", err)
	}
	os.Exit(code)
}
