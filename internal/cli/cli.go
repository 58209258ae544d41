// Package cli holds what every shardlab command's main function shares: a context that
// SIGINT and SIGTERM cancel, and one mapping from errors to exit codes.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Code maps an error (matched with errors.Is) to an exit status.
type Code struct {
	Err  error
	Exit int
}

// ExitStatus returns the status for err: 0 for nil and flag.ErrHelp, the first matching
// Code's status, else 1.
func ExitStatus(err error, codes ...Code) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	for _, c := range codes {
		if errors.Is(err, c.Err) {
			return c.Exit
		}
	}
	return 1
}

// Main runs run with a context cancelled by SIGINT or SIGTERM, prints a failure as
// "name: error" on stderr and exits with ExitStatus. Commands conventionally map their
// usage error to status 2.
func Main(name string, run func(ctx context.Context, args []string) error, codes ...Code) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	status := ExitStatus(err, codes...)
	if status != 0 {
		fmt.Fprintln(os.Stderr, Message(name, err))
	}
	os.Exit(status)
}

// Message is how Main reports err: "name: message". A library's errors often start
// with its package's name, which is the command's name too (package loadgen under
// command loadgen): Message drops such a repeated "name: ", at the start or after a
// ": ", so that the line never reads "loadgen: usage: loadgen: ...".
func Message(name string, err error) string {
	msg := strings.TrimPrefix(err.Error(), name+": ")
	msg = strings.ReplaceAll(msg, ": "+name+": ", ": ")
	return name + ": " + msg
}
