package sqlexec_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/sqlexec"
)

// TestSettlerDialsThroughItsDial: a settler given a Dial opens its connections to the
// data sources with it (the wire proxy passes its server connections' keepalive and
// user timeout that way), not with pgconn's own dialer.
func TestSettlerDialsThroughItsDial(t *testing.T) {
	c := pgtest.StartClusterWith(t, "max_prepared_transactions = 5")
	dsns := []string{c.NewDatabase("settledial_s0"), c.NewDatabase("settledial_s1")}
	committer := sqlexec.NewCommitter(kvRules(t, dsns), true)
	var dials atomic.Int32
	s, err := sqlexec.NewSettler(committer, sqlexec.SettlerConfig{Interval: -1, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := dials.Load(); n < int32(len(dsns)) {
		t.Errorf("the settler dialled %d times through its Dial, want at least once a data source (%d)", n, len(dsns))
	}
}
