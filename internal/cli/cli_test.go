package cli_test

import (
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/shardlab/shardlab/internal/cli"
)

func TestMessageNamesTheCommandOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"usl", errors.New("standard input: too few points"), "usl: standard input: too few points"},
		{"loadgen", fmt.Errorf("usage: %w", errors.New("loadgen: invalid configuration")), "loadgen: usage: invalid configuration"},
		{"counterbench", errors.New("counterbench: count differs"), "counterbench: count differs"},
		// Another package's name, or the name inside a word, stays.
		{"report", errors.New("x.csv: resultscsv: bad header"), "report: x.csv: resultscsv: bad header"},
		{"usl", errors.New("uslx: thing"), "usl: uslx: thing"},
	} {
		if got := cli.Message(c.name, c.err); got != c.want {
			t.Errorf("Message(%q, %q) = %q, want %q", c.name, c.err, got, c.want)
		}
	}
}

func TestExitStatus(t *testing.T) {
	errUsage := errors.New("usage")
	errOdd := errors.New("odd")
	codes := []cli.Code{{Err: errUsage, Exit: 2}, {Err: errOdd, Exit: 3}}
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{flag.ErrHelp, 0},
		{fmt.Errorf("parse: %w", errUsage), 2},
		{fmt.Errorf("count: %w", errOdd), 3},
		{errors.New("disk on fire"), 1},
	} {
		if got := cli.ExitStatus(c.err, codes...); got != c.want {
			t.Errorf("ExitStatus(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
