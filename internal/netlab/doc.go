// Package netlab holds the tests of the network lab, scripts/netlab.sh: they bring a real
// network of namespaces up with real PostgreSQL clusters and delay lines, measure it from
// inside its hosts with netprobe, inject faults and check that nothing is left after
// down, an interrupt or a crash. They need root and network namespaces; where those are
// missing they say why and skip, unless SHARDLAB_REQUIRE_NETNS=1 (CI) makes that a
// failure.
package netlab
