// Command usl fits the Universal Scalability Law to a CSV of n,throughput points and
// prints sigma, kappa, lambda, the peak N* and R². Run `usl --help` for the details.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"shardlab/usl/uslcli"
)

func main() {
	err := uslcli.Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, uslcli.ErrUsage):
		fmt.Fprintln(os.Stderr, "usl:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "usl:", err)
		os.Exit(1)
	}
}
