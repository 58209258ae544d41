package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/postgres"
)

// noHang runs f with a context that has no deadline (like an HTTP request whose client
// waits forever) and fails the test if f does not return within hangLimit: the Store's
// own timeouts must bound it.
func noHang[T any](t *testing.T, what string, f func(ctx context.Context) T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f(context.Background()) }()
	select {
	case v := <-done:
		return v
	case <-time.After(hangLimit):
		t.Fatalf("%s still running after %v: a dead shard must fail, not hang", what, hangLimit)
		panic("unreachable")
	}
}

type getResult struct {
	data  []byte
	shard int
	err   error
}

// TestDeadShardLeavesOthersWorking stops the server of one shard of three: the other
// shards keep serving, the dead one fails fast with a *shardset.ShardError naming it,
// Health names it alone, and once the server is back the shard serves again with every
// write it acknowledged before.
func TestDeadShardLeavesOthersWorking(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.StartCluster(t)
	dsns := []string{
		pgtest.NewDatabase(t, "failover_shard0"),
		cluster.NewDatabase("failover_shard1"),
		pgtest.NewDatabase(t, "failover_shard2"),
	}
	stores, err := postgres.OpenShards(ctx, dsns, postgres.Options{PoolSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	set := newSet(t, stores)
	const perShard = 20
	keys := keysFor(set, 3*perShard)

	// acked holds every write the set acknowledged: all of them must be readable at the end.
	acked := map[string]string{}
	put := func(key, value string) error {
		_, err := set.Put(ctx, key, []byte(value))
		if err == nil {
			acked[key] = value
		}
		return err
	}
	for shard := range keys {
		for _, key := range keys[shard][:perShard] {
			if err := put(key, "before:"+key); err != nil {
				t.Fatalf("Put(%s) with every shard up: %v", key, err)
			}
		}
	}

	for round, stop := range []struct {
		name string
		stop func()
	}{
		{"stop", cluster.Stop}, // clean shutdown
		{"kill", cluster.Kill}, // crash: the restart replays the WAL
	} {
		t.Logf("round %d: %s the server of shard 1", round, stop.name)
		stop.stop()
		for _, shard := range []int{0, 2} {
			for _, key := range keys[shard][perShard*(round+1) : perShard*(round+2)] {
				if err := put(key, stop.name+":"+key); err != nil {
					t.Fatalf("Put(%s) on healthy shard %d while shard 1 is down: %v", key, shard, err)
				}
			}
			for _, key := range keys[shard][:perShard] {
				if got, _, err := set.Get(ctx, key); err != nil || string(got) != acked[key] {
					t.Fatalf("Get(%s) on healthy shard %d while shard 1 is down = %q, %v; want %q", key, shard, got, err, acked[key])
				}
			}
		}

		for i, key := range keys[1][:5] {
			value := stop.name + ":lost:" + key
			perr := noHang(t, "Put on the dead shard", func(ctx context.Context) error {
				_, err := set.Put(ctx, key, []byte(value))
				return err
			})
			checkDeadShardError(t, fmt.Sprintf("Put(%s) #%d", key, i), perr)
			if i == 0 {
				t.Logf("Put on the dead shard: %v", perr)
			}
			g := noHang(t, "Get on the dead shard", func(ctx context.Context) getResult {
				data, shard, err := set.Get(ctx, key)
				return getResult{data, shard, err}
			})
			if g.shard != 1 {
				t.Errorf("Get(%s) reports shard %d, want 1", key, g.shard)
			}
			checkDeadShardError(t, fmt.Sprintf("Get(%s) #%d", key, i), g.err)
		}

		health := noHang(t, "Health", func(ctx context.Context) []error { return set.Health(ctx) })
		for shard, err := range health {
			if (err != nil) != (shard == 1) {
				t.Errorf("Health()[%d] = %v; want only shard 1 unhealthy", shard, err)
			}
		}
		t.Logf("Health()[1]: %v", health[1])
		counts, err := set.Counts(ctx)
		var se *shardset.ShardError
		if !errors.As(err, &se) || se.Shard != 1 || counts[1] != -1 || counts[0] < perShard || counts[2] < perShard {
			t.Errorf("Counts with shard 1 down = %v, %v; want shard 1 = -1 and its ShardError", counts, err)
		}

		cluster.Start()
		// The pool needs no nudge: the very first calls after the restart succeed.
		for shard, err := range set.Health(ctx) {
			if err != nil {
				t.Errorf("after restart, Health()[%d] = %v", shard, err)
			}
		}
		for _, key := range keys[1][perShard*(round+1) : perShard*(round+2)] {
			if err := put(key, "after "+stop.name+":"+key); err != nil {
				t.Fatalf("Put(%s) on shard 1 after its server came back: %v", key, err)
			}
		}
		checkAcked(t, set, acked)
	}
}

func checkDeadShardError(t *testing.T, what string, err error) {
	t.Helper()
	var se *shardset.ShardError
	switch {
	case err == nil:
		t.Fatalf("%s on the dead shard succeeded", what)
	case errors.Is(err, shardset.ErrNotFound):
		t.Fatalf("%s on the dead shard says not found, which would be a lie: %v", what, err)
	case !errors.As(err, &se) || se.Shard != 1:
		t.Fatalf("%s error = %v (%T), want a *shardset.ShardError for shard 1", what, err, err)
	case !strings.Contains(err.Error(), "shard 1"):
		t.Errorf("%s error does not name shard 1: %v", what, err)
	}
}

// checkAcked reads back every acknowledged write.
func checkAcked(t *testing.T, set *shardset.Set, acked map[string]string) {
	t.Helper()
	ctx := testCtx(t)
	perShard := make([]int64, set.Shards())
	for key, want := range acked {
		got, shard, err := set.Get(ctx, key)
		if err != nil || string(got) != want {
			t.Errorf("Get(%s) on shard %d = %q, %v; want the acknowledged %q", key, shard, got, err, want)
		}
		perShard[shard]++
	}
	counts, err := set.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range counts {
		if counts[i] != perShard[i] {
			t.Errorf("shard %d holds %d records; %d writes were acknowledged", i, counts[i], perShard[i])
		}
	}
}

// TestOpenWithShardDown covers both answers to "a shard is down at start": by default
// Open fails and says which server, with Lazy it opens and the shard starts working
// (its table created) once the server is up.
func TestOpenWithShardDown(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.StartCluster(t)
	dsn := cluster.NewDatabase("lazy")
	cluster.Stop()

	eagerErr := noHang(t, "Open", func(ctx context.Context) error {
		s, err := postgres.Open(ctx, dsn, postgres.Options{})
		if err == nil {
			s.Close()
		}
		return err
	})
	if eagerErr == nil {
		t.Fatal("Open succeeded with the server down")
	}
	if want := fmt.Sprintf("127.0.0.1:%d", cluster.Port()); !strings.Contains(eagerErr.Error(), want) {
		t.Errorf("Open error does not name the server %s: %v", want, eagerErr)
	}

	s := open(t, dsn, postgres.Options{Lazy: true})
	if err := noHang(t, "Ping", s.Ping); err == nil {
		t.Fatal("Ping succeeded with the server down")
	}
	if err := noHang(t, "Put", func(ctx context.Context) error { return s.Put(ctx, "k", []byte("v")) }); err == nil {
		t.Fatal("Put succeeded with the server down")
	}

	cluster.Start()
	if err := s.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Put once the server is up: %v", err)
	}
	if got, err := s.Get(ctx, "k"); err != nil || string(got) != "v" {
		t.Errorf("Get = %q, %v; want \"v\"", got, err)
	}
}

// TestFrozenShardTimesOut freezes a shard's server (connections open, nothing
// answering, like a hung host or a partition): calls without a deadline of their own
// must still fail, after the Store's timeouts, and work again once it thaws.
func TestFrozenShardTimesOut(t *testing.T) {
	ctx := testCtx(t)
	cluster := pgtest.StartCluster(t)
	s := open(t, cluster.NewDatabase("frozen"), postgres.Options{
		PoolSize:       2,
		ConnectTimeout: 500 * time.Millisecond,
		QueryTimeout:   time.Second,
	})
	if err := s.Put(ctx, "k", []byte("before")); err != nil {
		t.Fatal(err)
	}
	// Should a call hang after all, thaw before the Store's Close (which waits for
	// it) so that the test fails instead of hanging too.
	t.Cleanup(cluster.Thaw)

	cluster.Freeze()
	for i := range 3 { // the pooled connection, then fresh dials that get no answer
		if err := noHang(t, "Put on a frozen shard", func(ctx context.Context) error {
			return s.Put(ctx, "k", []byte("frozen"))
		}); err == nil {
			t.Fatalf("Put #%d on a frozen shard succeeded", i)
		}
	}
	if err := noHang(t, "Ping on a frozen shard", s.Ping); err == nil {
		t.Fatal("Ping on a frozen shard succeeded")
	}

	cluster.Thaw()
	if err := s.Put(ctx, "k", []byte("after")); err != nil {
		t.Fatalf("Put after thaw: %v", err)
	}
	if got, err := s.Get(ctx, "k"); err != nil || string(got) != "after" {
		t.Errorf("Get after thaw = %q, %v; want \"after\"", got, err)
	}
}

// TestEndedSessionsAreReplaced ends every session of a shard from the server side
// (as a restart, a failover proxy or idle_session_timeout would) right after they were
// used: the next calls must succeed on fresh connections, not fail on stale ones.
func TestEndedSessionsAreReplaced(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t, "ended")
	s := open(t, dsn, postgres.Options{PoolSize: 4})
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)

	for round := range 3 {
		// Fill the pool with idle connections.
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				if err := s.Put(ctx, fmt.Sprint("k", i), []byte("v")); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var ended int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()) AS t`, cfg.Database).Scan(&ended); err != nil {
			t.Fatal(err)
		}
		if ended == 0 {
			t.Fatalf("round %d: no session to end", round)
		}
		time.Sleep(50 * time.Millisecond) // let the FATAL messages arrive
		for i := range 4 {
			if _, err := s.Get(ctx, fmt.Sprint("k", i)); err != nil {
				t.Fatalf("round %d: Get after %d sessions were ended: %v", round, ended, err)
			}
		}
	}
}
