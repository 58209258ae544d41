package proxysweep

import "testing"

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want endpoint
		ok   bool
	}{
		{"198.18.0.10:5432", endpoint{"198.18.0.10", 5432}, true},
		{"[::1]:6432", endpoint{"::1", 6432}, true},
		{"localhost:1", endpoint{"localhost", 1}, true},
		{"198.18.0.10", endpoint{}, false},
		{":5432", endpoint{}, false},
		{"h:0", endpoint{}, false},
		{"h:65536", endpoint{}, false},
		{"h:pg", endpoint{}, false},
	} {
		got, err := parseEndpoint(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseEndpoint(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.String() != tc.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
}

// TestServiceAddrs: no --listen gives a free loopback port reached where it listens;
// --listen with --reach puts a delay line between.
func TestServiceAddrs(t *testing.T) {
	s := &sweep{}
	l, r, err := s.serviceAddrs()
	if err != nil || l != r || l.host != "127.0.0.1" || l.port == 0 {
		t.Errorf("default: %v %v %v", l, r, err)
	}
	s.cfg.Listen, s.cfg.Reach = "198.18.0.3:6433", "198.18.0.3:6432"
	l, r, err = s.serviceAddrs()
	if err != nil || l != (endpoint{"198.18.0.3", 6433}) || r != (endpoint{"198.18.0.3", 6432}) {
		t.Errorf("listen and reach: %v %v %v", l, r, err)
	}
	s.cfg.Reach = "nowhere"
	if _, _, err := s.serviceAddrs(); err == nil {
		t.Error("a reach without a port was taken")
	}
}
