package cli_test

import (
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/shardlab/shardlab/internal/cli"
)

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
