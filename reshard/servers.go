package reshard

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// serverState is what one server has for logical replication.
type serverState struct {
	id, database                        string // the server (system identifier and port), and the data source's database
	walLevel                            string
	maxSlots, usedSlots, usedOrigins    int
	maxSenders, usedSenders             int
	maxWorkers, usedWorkers, syncPerSub int
	maxProcesses                        int
}

func readServer(ctx context.Context, c *pgx.Conn) (serverState, error) {
	var s serverState
	// A server is known by what it is, not by how a DSN reaches it (localhost and
	// 127.0.0.1, a socket and TCP): its system identifier and port.
	err := c.QueryRow(ctx, `SELECT current_setting('port'), current_database(), current_setting('wal_level'),
		current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots)::int,
		(SELECT count(*) FROM pg_replication_origin)::int,
		current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication)::int,
		current_setting('max_logical_replication_workers')::int,
		(SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL)::int,
		current_setting('max_sync_workers_per_subscription')::int,
		current_setting('max_worker_processes')::int`).Scan(&s.id, &s.database, &s.walLevel,
		&s.maxSlots, &s.usedSlots, &s.usedOrigins, &s.maxSenders, &s.usedSenders, &s.maxWorkers, &s.usedWorkers, &s.syncPerSub,
		&s.maxProcesses)
	if err != nil {
		return s, err
	}
	// pg_control_system is for superusers (and those granted it): without it, the
	// server is known by the DSN's address.
	var sysid string
	if c.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&sysid) == nil {
		s.id = sysid + ":" + s.id
	} else {
		s.id = c.Config().Host + ":" + s.id
	}
	return s, nil
}

// checkServers reads each server's replication settings and what is in use, sets what
// the streams need of it, and notes every shortfall as a problem.
func checkServers(ctx context.Context, p *Plan, from, to *rules.Compiled, conns map[string]*pgx.Conn) error {
	addrOf := map[string]string{} // data source -> server id
	database := map[string]string{}
	var order []string
	byAddr := map[string]*Server{}
	state := map[string]serverState{}
	for _, l := range []*rules.Compiled{from, to} {
		for _, d := range l.DataSources() {
			if _, ok := addrOf[d.Name]; ok {
				continue
			}
			st, err := readServer(ctx, conns[d.Name])
			if err != nil {
				return fmt.Errorf("data source %s: reading the server's replication settings: %w", d.Name, err)
			}
			addr := st.id
			addrOf[d.Name] = addr
			database[d.Name] = st.id + "/" + st.database
			if byAddr[addr] == nil {
				shown, err := serverAddr(d.DSN)
				if err != nil {
					return fmt.Errorf("data source %s: %w", d.Name, err)
				}
				state[addr] = st
				byAddr[addr] = &Server{Addr: shown, WALLevel: st.walLevel, SlotsFree: st.maxSlots - st.usedSlots,
					OriginsFree: st.maxSlots - st.usedOrigins, SendersFree: st.maxSenders - st.usedSenders,
					WorkersFree: min(st.maxWorkers, st.maxProcesses-1) - st.usedWorkers}
				order = append(order, addr)
			}
			byAddr[addr].DataSources = append(byAddr[addr].DataSources, d.Name)
		}
	}
	publishes := map[string]bool{}
	for _, st := range p.Streams {
		if database[st.From] == database[st.To] {
			p.Problems = append(p.Problems, fmt.Sprintf("data sources %s and %s are one database (%s): rows cannot stream between them (a data source renamed, or schemas of one database)",
				st.From, st.To, database[st.From]))
		}
		pub, sub := byAddr[addrOf[st.From]], byAddr[addrOf[st.To]]
		// Each table of a new subscription is copied by a worker of its own, up to
		// max_sync_workers_per_subscription at a time, each with a slot and a sender of
		// its own on the publisher, and a replication origin on the subscriber (which
		// max_replication_slots bounds there too), while it copies.
		copying := min(st.PhysicalTables, state[addrOf[st.To]].syncPerSub)
		pub.SlotsNeeded += 1 + copying
		pub.SendersNeeded += 1 + copying
		sub.WorkersNeeded += 1 + copying
		sub.OriginsNeeded += 1 + copying
		publishes[addrOf[st.From]] = true
	}
	for _, addr := range order {
		s := byAddr[addr]
		st := state[addr]
		p.Servers = append(p.Servers, *s)
		if s.OriginsNeeded > s.OriginsFree {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s): the move needs %d replication origins as a subscriber, %d are free (max_replication_slots = %d bounds them too, %d in use): raise max_replication_slots and restart it",
				s.Addr, joinNames(s.DataSources), s.OriginsNeeded, s.OriginsFree, st.maxSlots, st.usedOrigins))
		}
		if publishes[addr] && s.WALLevel != "logical" {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s) has wal_level = %s, and rows move from it: set wal_level = logical and restart it",
				s.Addr, joinNames(s.DataSources), s.WALLevel))
		}
		if s.SlotsNeeded > s.SlotsFree {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s): the move needs %d replication slots, %d are free (max_replication_slots = %d, %d in use): raise max_replication_slots and restart it",
				s.Addr, joinNames(s.DataSources), s.SlotsNeeded, s.SlotsFree, st.maxSlots, st.usedSlots))
		}
		if s.SendersNeeded > s.SendersFree {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s): the move needs %d WAL senders, %d are free (max_wal_senders = %d, %d in use): raise max_wal_senders and restart it",
				s.Addr, joinNames(s.DataSources), s.SendersNeeded, s.SendersFree, st.maxSenders, st.usedSenders))
		}
		if s.WorkersNeeded > s.WorkersFree {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s): the move needs %d logical replication workers, %d are free (max_logical_replication_workers = %d, max_worker_processes = %d of which the launcher takes one, %d running); PostgreSQL would leave the rest unstarted without an error: raise max_logical_replication_workers and max_worker_processes and restart it",
				s.Addr, joinNames(s.DataSources), s.WorkersNeeded, s.WorkersFree, st.maxWorkers, st.maxProcesses, st.usedWorkers))
		}
	}
	return nil
}

func joinNames(names []string) string { return strings.Join(names, ", ") }
