package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/routing"
)

func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// keysPerShard returns n keys owned by each shard of r.
func keysPerShard(r routing.Router, n int) [][]string {
	out := make([][]string, r.Shards())
	for i := 0; ; i++ {
		k := fmt.Sprintf("pgkey%d", i)
		s := r.ShardFor(k)
		if len(out[s]) < n {
			out[s] = append(out[s], k)
		}
		done := true
		for _, ks := range out {
			done = done && len(ks) == n
		}
		if done {
			return out
		}
	}
}

// TestPostgresDeadShard runs the demo-server over three PostgreSQL shards, the middle one
// on a throwaway server that the test stops: requests for shards 0 and 2 keep working,
// requests for shard 1 get a 503 naming it, /healthz names it, and once the server is back
// shard 1 serves again with every write acknowledged before the outage.
func TestPostgresDeadShard(t *testing.T) {
	dsn0 := pgtest.NewDatabase(t, "e2e_shard0")
	dsn2 := pgtest.NewDatabase(t, "e2e_shard2")
	cluster := pgtest.StartCluster(t)
	dsn1 := cluster.NewDatabase("e2e_shard1")

	srv := startServer(t, t.TempDir(), "--mode", "sharded", "--shards", "3", "--backend", "postgres",
		"--dsn", dsn0, "--dsn", dsn1, "--dsn", dsn2, "--counter", "bucket", "--bucket-by", "worker")
	router, _ := routing.NewCRC32(3)
	keys := keysPerShard(router, 20)
	for s, ks := range keys {
		for _, k := range ks {
			code, body := postJSON(t, srv.url+"/insert", fmt.Sprintf(`{"user_id":%q,"data":"before-%s"}`, k, k))
			if code != http.StatusOK || !strings.Contains(body, fmt.Sprintf(`"shard":%d`, s)) {
				t.Fatalf("insert %s: %d %s", k, code, body)
			}
		}
	}

	cluster.Stop()
	for s, ks := range keys {
		k := ks[0]
		start := time.Now()
		code, body := postJSON(t, srv.url+"/insert", fmt.Sprintf(`{"user_id":%q,"data":"during"}`, k))
		if took := time.Since(start); took > 20*time.Second {
			t.Errorf("insert on shard %d took %v with shard 1 down", s, took)
		}
		if s == 1 {
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "shard 1") {
				t.Errorf("insert on the dead shard: want 503 naming shard 1, got %d %s", code, body)
			}
			status, _, _ := getRecord(t, srv.url, k)
			if status != http.StatusServiceUnavailable {
				t.Errorf("get on the dead shard: want 503, got %d", status)
			}
			continue
		}
		if code != http.StatusOK {
			t.Errorf("insert on healthy shard %d: %d %s", s, code, body)
		}
		if status, data, _ := getRecord(t, srv.url, ks[1]); status != http.StatusOK || data != "before-"+ks[1] {
			t.Errorf("get on healthy shard %d: %d %q", s, status, data)
		}
	}
	resp, err := http.Get(srv.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var health struct {
		Status    string `json:"status"`
		Unhealthy []int  `json:"unhealthy_shards"`
	}
	json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || len(health.Unhealthy) != 1 || health.Unhealthy[0] != 1 {
		t.Errorf("/healthz with shard 1 down: %d %+v", resp.StatusCode, health)
	}

	cluster.Start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(srv.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("shard 1 did not recover")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, k := range keys[1] {
		if status, data, shard := getRecord(t, srv.url, k); status != http.StatusOK || data != "before-"+k || shard != 1 {
			t.Errorf("after recovery %s: %d %q shard %d", k, status, data, shard)
		}
	}
	if code, body := postJSON(t, srv.url+"/insert", fmt.Sprintf(`{"user_id":%q,"data":"after"}`, keys[1][0])); code != http.StatusOK {
		t.Errorf("insert after recovery: %d %s", code, body)
	}
	if err := srv.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v\n%s", err, srv.logs)
	}
}

// TestCounterEndpointsExact hammers one hot key through the HTTP API with every counter
// strategy on both backends and checks the count equals the acknowledged increments.
func TestCounterEndpointsExact(t *testing.T) {
	type backend struct {
		name string
		args func(t *testing.T) []string
	}
	backends := []backend{
		{"sqlite", func(t *testing.T) []string { return nil }},
		{"postgres", func(t *testing.T) []string {
			return []string{"--backend", "postgres", "--dsn", pgtest.NewDatabase(t, "e2e_counter")}
		}},
	}
	strategies := []struct {
		name string
		args []string
	}{
		{"row", []string{"--counter", "row"}},
		{"append", []string{"--counter", "append"}},
		{"bucket-random", []string{"--counter", "bucket", "--buckets", "10", "--bucket-by", "random"}},
		{"bucket-time", []string{"--counter", "bucket", "--buckets", "10", "--bucket-by", "time"}},
		{"bucket-worker", []string{"--counter", "bucket", "--buckets", "10", "--bucket-by", "worker"}},
	}
	for _, b := range backends {
		for _, st := range strategies {
			t.Run(b.name+"/"+st.name, func(t *testing.T) {
				args := append(append([]string{"--mode", "single"}, b.args(t)...), st.args...)
				srv := startServer(t, t.TempDir(), args...)
				const workers, each = 8, 40
				acked := make(chan int64, workers*each)
				errs := make(chan string, workers*each)
				done := make(chan struct{})
				for w := range workers {
					go func() {
						defer func() { done <- struct{}{} }()
						for i := range each {
							by := int64(1 + (w+i)%3)
							resp, err := http.Post(srv.url+"/counter/incr", "application/json",
								strings.NewReader(fmt.Sprintf(`{"key":"10.0.0.1","by":%d}`, by)))
							if err != nil {
								errs <- err.Error()
								continue
							}
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode == http.StatusOK {
								acked <- by
							} else {
								errs <- resp.Status
							}
						}
					}()
				}
				for range workers {
					<-done
				}
				close(acked)
				close(errs)
				var want int64
				for by := range acked {
					want += by
				}
				for e := range errs {
					t.Errorf("increment failed: %s", e)
				}
				resp, err := http.Get(srv.url + "/counter?key=10.0.0.1")
				if err != nil {
					t.Fatal(err)
				}
				var v struct {
					Count    int64     `json:"count"`
					LastSeen time.Time `json:"last_seen"`
				}
				json.NewDecoder(resp.Body).Decode(&v)
				resp.Body.Close()
				if v.Count != want || want == 0 {
					t.Errorf("count %d, acknowledged %d", v.Count, want)
				}
				if time.Since(v.LastSeen) > time.Minute || v.LastSeen.After(time.Now().Add(time.Second)) {
					t.Errorf("last_seen %v is not recent", v.LastSeen)
				}
				srv.stop(syscall.SIGTERM)
			})
		}
	}
}

// TestPostgresLazyStart: with --lazy the server starts while shard 1's server is down,
// serves shards 0 and 2, answers 503 for shard 1, and serves it once it is up.
func TestPostgresLazyStart(t *testing.T) {
	dsn0 := pgtest.NewDatabase(t, "e2e_lazy0")
	dsn2 := pgtest.NewDatabase(t, "e2e_lazy2")
	cluster := pgtest.StartCluster(t)
	dsn1 := cluster.NewDatabase("e2e_lazy1")
	cluster.Stop()
	args := []string{"--mode", "sharded", "--shards", "3", "--backend", "postgres", "--dsn", dsn0, "--dsn", dsn1, "--dsn", dsn2}

	// Without --lazy the server refuses to start, naming the dead shard.
	refuse := exec.Command(filepath.Join(binDir, "demo-server"), append(args, "--data", t.TempDir(), "--addr", "127.0.0.1:0")...)
	out, err := refuse.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "shard 1") {
		t.Fatalf("started with shard 1 down and no --lazy, or did not name it: %v\n%s", err, out)
	}

	srv := startServer(t, t.TempDir(), append(args, "--lazy")...)
	router, _ := routing.NewCRC32(3)
	keys := keysPerShard(router, 1)
	for s, ks := range keys {
		code, body := postJSON(t, srv.url+"/insert", fmt.Sprintf(`{"user_id":%q,"data":"x"}`, ks[0]))
		want := http.StatusOK
		if s == 1 {
			want = http.StatusServiceUnavailable
		}
		if code != want {
			t.Errorf("insert on shard %d with shard 1 down: %d %s, want %d", s, code, body, want)
		}
	}
	cluster.Start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := postJSON(t, srv.url+"/insert", fmt.Sprintf(`{"user_id":%q,"data":"y"}`, keys[1][0]))
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard 1 never served after it came up: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status, data, _ := getRecord(t, srv.url, keys[1][0]); status != http.StatusOK || data != "y" {
		t.Errorf("read back from shard 1: %d %q", status, data)
	}
	srv.stop(syscall.SIGTERM)
}
