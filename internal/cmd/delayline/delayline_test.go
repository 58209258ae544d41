package delayline_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/cmd/delayline"
)

func TestRunRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"extra"},
		{"--procs", "-1"},
		{"--frobnicate"},
	} {
		var stderr bytes.Buffer
		if err := delayline.Run(context.Background(), args, &stderr); !errors.Is(err, delayline.ErrUsage) {
			t.Errorf("delayline %v: %v, want a usage error", args, err)
		}
	}
	var stderr bytes.Buffer
	if err := delayline.Run(context.Background(), []string{"--help"}, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), `"delay"`) {
		t.Errorf("--help: %v\n%s", err, stderr.String())
	}
}
