package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestRunRefusesBadAddresses: --server, --listen and --reach are checked with the other
// flags (exit 2), before the sweep creates anything.
func TestRunRefusesBadAddresses(t *testing.T) {
	for _, tc := range []struct {
		flag, value, want string
	}{
		{"--server", "198.18.0.10", "--server: want HOST:PORT"},
		{"--listen", "198.18.0.3:0", "--listen: want HOST:PORT with a port from 1 to 65535"},
		{"--reach", ":6432", "--reach: want HOST:PORT"},
	} {
		args := []string{"run", "--out", t.TempDir(), "--proxy", "shard-proxy", tc.flag, tc.value}
		if tc.flag == "--reach" {
			args = append(args, "--listen", "198.18.0.3:6433")
		}
		err := run(context.Background(), args, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: %v, want a usage error containing %q", tc.flag, tc.value, err, tc.want)
		}
	}
}
