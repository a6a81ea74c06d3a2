package netns

import (
	"net/netip"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	bad := []struct {
		cfg  Config
		want string
	}{
		{Config{Hosts: 0, Prefix: "p-"}, "hosts 0"},
		{Config{Hosts: maxHosts + 1, Prefix: "p-"}, "hosts 1025"},
		{Config{Hosts: 2, Prefix: ""}, "length 0"},
		{Config{Hosts: 2, Prefix: "a/b"}, "not allowed"},
		{Config{Hosts: 2, Prefix: "a b"}, "not allowed"},
		{Config{Hosts: 2, Prefix: strings.Repeat("x", 65)}, "length 65"},
		{Config{Hosts: 2, Prefix: "p-", Subnet: netip.MustParsePrefix("8.8.8.0/24")}, "private"},
		{Config{Hosts: 2, Prefix: "p-", Subnet: netip.MustParsePrefix("fd00::/64")}, "IPv4"},
		{Config{Hosts: 2, Prefix: "p-", Subnet: netip.MustParsePrefix("10.77.0.1/24")}, "host bits"},
		{Config{Hosts: 3, Prefix: "p-", Subnet: netip.MustParsePrefix("10.77.0.0/30")}, "fewer than 3"},
		{Config{Hosts: 1, Prefix: "p-", Subnet: netip.MustParsePrefix("10.77.0.0/31")}, "fewer than 1"},
	}
	for _, b := range bad {
		err := b.cfg.validate()
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("validate(%+v) = %v, want error containing %q", b.cfg, err, b.want)
		}
	}
	good := Config{Hosts: 2, Prefix: "fpmi1-a_b.c-"}
	if err := good.validate(); err != nil {
		t.Fatalf("validate(%+v) = %v", good, err)
	}
	if good.Subnet != DefaultSubnet {
		t.Errorf("default subnet = %v, want %v", good.Subnet, DefaultSubnet)
	}
	two := Config{Hosts: 2, Prefix: "p-", Subnet: netip.MustParsePrefix("192.168.7.0/30")}
	if err := two.validate(); err != nil {
		t.Errorf("validate(%+v) = %v", two, err)
	}
}

func TestPrefixFor(t *testing.T) {
	p := PrefixFor("fpmit", "3")
	if err := checkPrefix(p); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p, "fpmit") || !strings.HasSuffix(p, "-3-") {
		t.Errorf("PrefixFor = %q", p)
	}
}
