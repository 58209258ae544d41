// Package e2e holds the lab's end-to-end tests: they build the real binaries, run the
// demo-server as a separate process on loopback, drive it with loadgen, and then open the
// SQLite shard files directly to prove that every acknowledged write is stored, on the
// shard the router names, across clean restarts and crashes.
package e2e
